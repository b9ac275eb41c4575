//! A storm through libvirt: N `virsh create --paused` at once.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use super::super::libvirt::LibvirtStarter;
use super::super::{Result, VmStartBenchError};
use super::world::StormWorld;
use super::StormCase;

impl StormWorld {
    /// N `virsh create --paused` at once; each VM's time is until its virsh returned.
    pub(super) fn storm_libvirt(
        &self,
        lv: &LibvirtStarter,
        case: StormCase,
        tag: usize,
    ) -> Result<Vec<f64>> {
        lv.set_cold(case == StormCase::Floor)?;
        let uuids: Vec<String> = (0..self.count)
            .map(|i| format!("57a0b007-0000-4000-8000-{:06x}{:06x}", tag % 0x100_0000, i))
            .collect();
        let mut files = Vec::with_capacity(self.count);
        for uuid in &uuids {
            let file = lv.xml_dir().join(format!("storm-{uuid}.xml"));
            std::fs::write(
                &file,
                lv.domain_xml_of(self.size, self.ps, self.threads, case.domain_case(), uuid),
            )
            .map_err(|source| VmStartBenchError::Io {
                op: "write a storm domain's XML",
                source,
            })?;
            files.push(file.to_string_lossy().into_owned());
        }
        let barrier = Arc::new(Barrier::new(self.count));
        let started = Instant::now();
        let outcomes: Vec<Result<f64>> = std::thread::scope(|s| {
            let handles: Vec<_> = files
                .iter()
                .map(|file| {
                    let barrier = Arc::clone(&barrier);
                    s.spawn(move || {
                        barrier.wait();
                        lv.virsh_ok(&["create", "--paused", file])?;
                        Ok(started.elapsed().as_secs_f64())
                    })
                })
                .collect();
            handles.into_iter().map(super::joined).collect()
        });
        // `release end` gives each hook lease back before destroy returns.
        for (uuid, outcome) in uuids.iter().zip(&outcomes) {
            if outcome.is_ok() {
                lv.virsh_ok(&["destroy", uuid])?;
            }
        }
        for file in &files {
            let _ = std::fs::remove_file(file);
        }
        outcomes.into_iter().collect()
    }
}
