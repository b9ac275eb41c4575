//! The smallest guest a VMM that boots PVH kernels (cloud-hypervisor `--kernel`) can run: a
//! 64-bit ELF whose `XEN_ELFNOTE_PHYS32_ENTRY` note points at a few bytes of 32-bit code.
//!
//! PVH enters in flat 32-bit protected mode without paging, so the code reaches every
//! guest-physical address below 4 GiB. For each address in its table it checks that 4 KiB
//! there read zero, then fills them with the dwords `address ^ key`; it then writes
//! [`REPORT_OK`] (or [`REPORT_NOT_ZERO`] at the first sample that is not zero) to the
//! serial port at 0x3f8 and halts with interrupts off. The host finds the pattern through the
//! files that back the guest's memory. With no addresses it only reports: a VM that boots
//! and runs, for timing a start.

/// Where the image is loaded and entered (1 MiB: linux-loader refuses an entry below it).
pub const LOAD: u64 = 0x10_0000;
/// Lowest address the guest may sample: above its image, its table (at most 1 MiB) and the
/// VMM's boot data below 1 MiB.
pub const FIRST_SAMPLE: u64 = 0x20_0000;
/// Bytes checked and written at each sample.
pub const SAMPLE_BYTES: u64 = 4096;
/// The serial line written when every sample read zero and was filled.
pub const REPORT_OK: &str = "HUGEPREP-GUEST OK";
/// The serial line written when a sample was not zero.
pub const REPORT_NOT_ZERO: &str = "HUGEPREP-GUEST NOT-ZERO";
/// Most samples a guest takes (its table must end below [`FIRST_SAMPLE`]).
pub const MAX_SAMPLES: usize = 0x3_0000;

/// Offsets inside the loaded image.
const OK_MESSAGE: u64 = 0x80;
const NOT_ZERO_MESSAGE: u64 = 0xa0;
const TABLE: u64 = 0x100;

/// 32-bit code; the four-byte immediates at the offsets in [`PATCHES`] are filled in.
const CODE: [u8; 0x4b] = [
    0xbe, 0, 0, 0, 0, // 0x00: mov esi, TABLE
    0xbd, 0, 0, 0, 0, // 0x05: mov ebp, count
    0xba, 0, 0, 0, 0, // 0x0a: mov edx, key
    0x8b, 0x3e, // 0x0f: next: mov edi, [esi]
    0xb9, 0x00, 0x04, 0x00, 0x00, // 0x11: mov ecx, 1024
    0x31, 0xc0, // 0x16: xor eax, eax
    0xf3, 0xaf, // 0x18: repe scasd
    0x75, 0x1a, // 0x1a: jnz bad
    0x8b, 0x3e, // 0x1c: mov edi, [esi]
    0x89, 0xf8, // 0x1e: mov eax, edi
    0x31, 0xd0, // 0x20: xor eax, edx
    0xb9, 0x00, 0x04, 0x00, 0x00, // 0x22: mov ecx, 1024
    0xf3, 0xab, // 0x27: rep stosd
    0x83, 0xc6, 0x04, // 0x29: add esi, 4
    0x4d, // 0x2c: dec ebp
    0x75, 0xe0, // 0x2d: jnz next
    0xbe, 0, 0, 0, 0, // 0x2f: mov esi, OK_MESSAGE
    0xeb, 0x05, // 0x34: jmp report
    0xbe, 0, 0, 0, 0, // 0x36: bad: mov esi, NOT_ZERO_MESSAGE
    0x66, 0xba, 0xf8, 0x03, // 0x3b: report: mov dx, 0x3f8
    0xac, // 0x3f: lodsb
    0x84, 0xc0, // 0x40: test al, al
    0x74, 0x03, // 0x42: jz halt
    0xee, // 0x44: out dx, al
    0xeb, 0xf8, // 0x45: jmp 0x3f
    0xfa, // 0x47: halt: cli
    0xf4, // 0x48: hlt
    0xeb, 0xfc, // 0x49: jmp halt
];

/// Where `mov esi, TABLE`, `mov ebp, count`, `mov edx, key` and the two message moves keep
/// their immediates.
const PATCHES: [usize; 5] = [0x01, 0x06, 0x0b, 0x30, 0x37];
/// Where the code skips the sample loop when the table is empty: `jmp` over it.
const NO_SAMPLES_JUMP: usize = 0x0f;

/// What cannot be made into a guest.
#[derive(Debug, thiserror::Error)]
pub enum PvhGuestError {
    /// A sample address is outside what the guest may touch.
    #[error(
        "pvh guest: sample {addr:#x} must be 4 KiB aligned and lie in {FIRST_SAMPLE:#x}..4 GiB"
    )]
    Sample {
        /// The address.
        addr: u64,
    },
    /// Too many samples for the table.
    #[error("pvh guest: {count} samples, at most {MAX_SAMPLES}")]
    TooMany {
        /// Samples asked for.
        count: usize,
    },
}

/// The ELF image of a guest that checks and fills `samples` with `address ^ key`.
pub fn image(samples: &[u64], key: u32) -> Result<Vec<u8>, PvhGuestError> {
    if samples.len() > MAX_SAMPLES {
        return Err(PvhGuestError::TooMany {
            count: samples.len(),
        });
    }
    if let Some(&addr) = samples
        .iter()
        .find(|&&a| a < FIRST_SAMPLE || a % SAMPLE_BYTES != 0 || a + SAMPLE_BYTES > 1 << 32)
    {
        return Err(PvhGuestError::Sample { addr });
    }
    let mut body = vec![0u8; TABLE as usize + 4 * samples.len()];
    body[..CODE.len()].copy_from_slice(&CODE);
    let immediates = [
        (LOAD + TABLE) as u32,
        samples.len() as u32,
        key,
        (LOAD + OK_MESSAGE) as u32,
        (LOAD + NOT_ZERO_MESSAGE) as u32,
    ];
    for (&at, value) in PATCHES.iter().zip(immediates) {
        body[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }
    if samples.is_empty() {
        // `jmp 0x2f` (over the loop, to the OK report): a loop run with a count of 0 would
        // take 2^32 turns.
        body[NO_SAMPLES_JUMP] = 0xeb;
        body[NO_SAMPLES_JUMP + 1] = (0x2f - (NO_SAMPLES_JUMP + 2)) as u8;
    }
    for (at, text) in [(OK_MESSAGE, REPORT_OK), (NOT_ZERO_MESSAGE, REPORT_NOT_ZERO)] {
        let line = format!("{text}\n");
        body[at as usize..at as usize + line.len()].copy_from_slice(line.as_bytes());
    }
    for (i, &addr) in samples.iter().enumerate() {
        let at = TABLE as usize + 4 * i;
        body[at..at + 4].copy_from_slice(&(addr as u32).to_le_bytes());
    }
    Ok(elf(&body))
}

/// The dword the guest writes at guest-physical `addr` (every dword of that sample's 4 KiB).
pub fn pattern(addr: u64, key: u32) -> u32 {
    (addr as u32) ^ key
}

/// Samples spread over `[FIRST_SAMPLE, end)`: one at the start of every `stride` bytes.
pub fn spread(end: u64, stride: u64) -> Vec<u64> {
    (FIRST_SAMPLE..end.min(1 << 32))
        .step_by(stride.max(SAMPLE_BYTES) as usize)
        .filter(|a| a + SAMPLE_BYTES <= end)
        .take(MAX_SAMPLES)
        .collect()
}

/// A 64-bit little-endian ELF executable: one `PT_LOAD` of `body` at [`LOAD`] and one
/// `PT_NOTE` with the PVH entry (name "Xen", type 18, the 32-bit entry address).
fn elf(body: &[u8]) -> Vec<u8> {
    const EHDR: usize = 64;
    const PHDR: usize = 56;
    const NOTE: usize = 12 + 4 + 4;
    const BODY: usize = 0x100;
    let note_at = EHDR + 2 * PHDR;
    let mut out = Vec::with_capacity(BODY + body.len());
    // e_ident: magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT, System V ABI.
    out.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&2u16.to_le_bytes()); // e_type: ET_EXEC
    out.extend_from_slice(&0x3eu16.to_le_bytes()); // e_machine: x86-64
    out.extend_from_slice(&1u32.to_le_bytes()); // e_version
    out.extend_from_slice(&LOAD.to_le_bytes()); // e_entry
    out.extend_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
    out.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    out.extend_from_slice(&(EHDR as u16).to_le_bytes()); // e_ehsize
    out.extend_from_slice(&(PHDR as u16).to_le_bytes()); // e_phentsize
    out.extend_from_slice(&2u16.to_le_bytes()); // e_phnum
    out.extend_from_slice(&[0; 6]); // e_shentsize, e_shnum, e_shstrndx
    let phdr = |out: &mut Vec<u8>, kind: u32, flags: u32, offset: usize, addr: u64, size: usize| {
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        out.extend_from_slice(&addr.to_le_bytes()); // p_vaddr
        out.extend_from_slice(&addr.to_le_bytes()); // p_paddr
        out.extend_from_slice(&(size as u64).to_le_bytes()); // p_filesz
        out.extend_from_slice(&(size as u64).to_le_bytes()); // p_memsz
        out.extend_from_slice(&4u64.to_le_bytes()); // p_align
    };
    // PT_LOAD, read/write/execute.
    phdr(&mut out, 1, 7, BODY, LOAD, body.len());
    // PT_NOTE.
    phdr(&mut out, 4, 4, note_at, 0, NOTE);
    out.extend_from_slice(&4u32.to_le_bytes()); // n_namesz ("Xen\0")
    out.extend_from_slice(&4u32.to_le_bytes()); // n_descsz
    out.extend_from_slice(&18u32.to_le_bytes()); // XEN_ELFNOTE_PHYS32_ENTRY
    out.extend_from_slice(b"Xen\0");
    out.extend_from_slice(&(LOAD as u32).to_le_bytes());
    out.resize(BODY, 0);
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_carries_entry_note_code_and_table() {
        let img = image(&[0x20_0000, 0x40_0000], 0xabcd).unwrap();
        assert_eq!(&img[..4], b"\x7fELF");
        // The note's descriptor is the entry.
        let note = 64 + 2 * 56;
        assert_eq!(&img[note + 12..note + 16], b"Xen\0");
        assert_eq!(img[note + 16..note + 20], (LOAD as u32).to_le_bytes());
        let body = &img[0x100..];
        assert_eq!(body[0], 0xbe);
        assert_eq!(body[1..5], ((LOAD + TABLE) as u32).to_le_bytes());
        assert_eq!(body[6..10], 2u32.to_le_bytes());
        assert_eq!(body[0x104..0x108], 0x40_0000u32.to_le_bytes());
        assert!(body[0x80..].starts_with(b"HUGEPREP-GUEST OK\n"));
    }

    #[test]
    fn samples_must_be_above_the_image_and_aligned() {
        assert!(matches!(
            image(&[0x1000], 0),
            Err(PvhGuestError::Sample { addr: 0x1000 })
        ));
        assert!(image(&[0x20_0800], 0).is_err());
        assert!(image(&[], 0).is_ok());
        assert_eq!(spread(0x60_0000, 0x20_0000), [0x20_0000, 0x40_0000]);
    }
}
