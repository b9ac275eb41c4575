//! A KVM virtual machine with one vCPU whose guest memory is a `vm_memory::GuestMemoryMmap`
//! (for example a hugeprep lease mapped shared): the one unsafe step, telling KVM where the
//! guest's RAM lives, is done here with the memory owned alongside the VM.

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

/// Creating the VM or registering its memory failed.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    /// An ioctl on /dev/kvm, the VM or the vCPU failed.
    #[error("{op}: {source}")]
    Ioctl {
        /// What was being done.
        op: &'static str,
        /// The kernel's answer.
        source: kvm_ioctls::Error,
    },
}

fn ioctl(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> KvmError {
    move |source| KvmError::Ioctl { op, source }
}

/// A VM with one vCPU over guest memory it owns. Fields drop in order: the vCPU and the VM
/// (KVM's references to the memory) go before the memory is unmapped.
#[derive(Debug)]
pub struct KvmGuest {
    /// The vCPU (set its registers, run it).
    pub vcpu: VcpuFd,
    vm: VmFd,
    mem: GuestMemoryMmap,
    _kvm: Kvm,
}

impl KvmGuest {
    /// Opens /dev/kvm, creates a VM, registers every region of `mem` as a memory slot at its
    /// guest-physical address, and creates vCPU 0.
    pub fn new(mem: GuestMemoryMmap) -> Result<KvmGuest, KvmError> {
        let kvm = Kvm::new().map_err(ioctl("open /dev/kvm"))?;
        let vm = kvm.create_vm().map_err(ioctl("KVM_CREATE_VM"))?;
        // Intel without unrestricted guest needs it for real mode; harmless elsewhere.
        let _ = vm.set_tss_address(0xfffb_d000);
        for (slot, region) in mem.iter().enumerate() {
            let desc = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
            };
            // SAFETY: the region is a live mapping of `memory_size` bytes owned by `mem`,
            // which this value keeps until after the VM is closed (field order above).
            unsafe { vm.set_user_memory_region(desc) }
                .map_err(ioctl("KVM_SET_USER_MEMORY_REGION"))?;
        }
        let vcpu = vm.create_vcpu(0).map_err(ioctl("KVM_CREATE_VCPU"))?;
        Ok(KvmGuest {
            vcpu,
            vm,
            mem,
            _kvm: kvm,
        })
    }

    /// The guest memory.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The VM.
    pub fn vm(&self) -> &VmFd {
        &self.vm
    }
}
