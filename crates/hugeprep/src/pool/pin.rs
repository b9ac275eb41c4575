//! Long-term pins of `pin: true` leases: taken after the file is ready and before the lease
//! is returned, held in memory only (a crash drops them with the process, so recovery needs
//! no pin state), and dropped at release before the scrub, or at shutdown.

use super::host::{FileAt, Pin};
use super::*;

impl Pool {
    /// Pins every page of the file of a `pin: true` request; `None` for other requests.
    pub(super) fn pin_lease(&self, v: &ValidRequest, id: u64) -> Result<Option<Pin>> {
        if !v.pin {
            return Ok(None);
        }
        let at = FileAt {
            page_size: v.page_size,
            id,
        };
        let file = self.host.open(at)?;
        let len = usize::try_from(file.size()).map_err(|_| PoolError::Field {
            field: "size",
            message: format!("{} bytes do not fit this machine's address space", v.size),
        })?;
        let _long = super::lease::long_work(file.size());
        let pin = self.host.pin(&file, len)?;
        tracing::info!(
            name = %v.name,
            bytes = len,
            pin_ms = pin.took().as_secs_f64() * 1e3,
            "pinned"
        );
        Ok(Some(pin))
    }

    /// Keeps the pin of file `id` until release; says whether there was one.
    pub(super) fn hold_pin(&self, id: u64, pin: Option<Pin>) -> bool {
        match pin {
            Some(pin) => {
                self.lock_pins().insert(pin.id(), pin);
                self.lock().pinned.insert(id);
                true
            }
            None => false,
        }
    }

    /// Drops the pin of file `id`, if any.
    pub(super) fn unpin(&self, id: u64) {
        let pin = self.lock_pins().remove(&id);
        self.lock().pinned.remove(&id);
        if let Some(pin) = pin {
            let took = self.host.unpin(pin);
            tracing::debug!(id, unpin_ms = took.as_secs_f64() * 1e3, "unpinned");
        }
    }

    /// Drops every pin (shutdown).
    pub(super) fn unpin_all(&self) {
        let pins = std::mem::take(&mut *self.lock_pins());
        for pin in pins.into_values() {
            self.host.unpin(pin);
        }
    }

    /// Sets `pinned` on the leases whose file is pinned.
    pub(super) fn mark_pinned(&self, leases: &mut [LeaseInfo]) {
        let pins = self.lock_pins();
        let st = self.lock();
        for e in st.core.files() {
            if let FileState::Leased(l) = &e.rec().state {
                if pins.contains_key(&e.rec().id) {
                    if let Some(info) = leases.iter_mut().find(|i| i.id == l.id) {
                        info.pinned = true;
                    }
                }
            }
        }
    }

    fn lock_pins(&self) -> MutexGuard<'_, BTreeMap<u64, Pin>> {
        self.tenants.pins.lock().unwrap_or_else(|e| e.into_inner())
    }
}
