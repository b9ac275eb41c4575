//! The clearing side: the scrubber, the control that cancels or hurries scrubs, the start
//! gate that holds background work while a VM starts, and the proof that a released file
//! is out of every process's reach.

use std::sync::Arc;
use std::time::Duration;

use crate::pool::{gate, reach};
use crate::scrub::{ScrubControl, Scrubber};

/// How the pool clears and proves memory (see the module).
#[derive(Debug)]
pub(in crate::pool) struct Clearing {
    pub(in crate::pool) scrubber: Arc<Scrubber>,
    pub(in crate::pool) control: Arc<ScrubControl>,
    /// Holds refills and background scrubs while a VM start is under way.
    pub(in crate::pool) gate: Arc<gate::StartGate>,
    /// Who opened leased files, and the proofs that released ones are out of reach.
    pub(in crate::pool) reach: Arc<reach::Reach>,
}

impl Clearing {
    /// The clearing side over `scrubber` and `reach`, its gate leaving new lessees `grace`.
    pub(super) fn new(
        scrubber: Arc<Scrubber>,
        reach: Arc<reach::Reach>,
        grace: Duration,
    ) -> Clearing {
        let control = Arc::new(ScrubControl::default());
        let gate = Arc::new(gate::StartGate::new(
            Arc::clone(&reach),
            Arc::clone(&control),
        ));
        gate.set_grace(grace);
        Clearing {
            scrubber,
            control,
            gate,
            reach,
        }
    }
}
