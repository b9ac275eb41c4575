//! A look at the forecast (`core::forecast`): the files to keep warm now, and why.

use super::files::{self, class_of, Files};
use super::{
    bucket, bucket_name, Forecast, Inputs, Target, Why, LEARNING_S, MIN_HORIZON_S, RECENT_S,
};

impl Forecast {
    /// The target at a look. The known demand (`inputs.pending`, bytes of allocations not
    /// yet leased, sizes unknown) counts as one file of its bytes' class: see
    /// [`Forecast::target_known`] for allocations whose sizes are known.
    pub fn target(&self, inputs: &Inputs) -> Target {
        let pending: &[u64] = if inputs.pending > 0 {
            &[inputs.pending]
        } else {
            &[]
        };
        self.target_known(inputs, pending)
    }

    /// The target at a look, with the known demand given as the sizes of the VMs due
    /// (allocations made, not yet leased): a file of each is added. `inputs.pending` is
    /// ignored for the files; [`Why::pending`] shows the sizes' sum.
    pub fn target_known(&self, inputs: &Inputs, pending: &[u64]) -> Target {
        let now = inputs.now_s;
        let b = bucket(now);
        let next = bucket(now + self.horizon_s.max(MIN_HORIZON_S));
        let (history, mut planned) = match (self.thresholds(b), self.thresholds(next)) {
            (None, None) => (false, Files::new()),
            (p, q) => {
                let mut f = p.cloned().unwrap_or_default();
                if let Some(q) = q {
                    files::max_into(&mut f, q);
                }
                (true, f)
            }
        };
        planned.retain(|_, b| *b > 0);
        let planned_bytes = files::total(&files::nest(&planned));
        let recent = self.peaks(now - RECENT_S);
        let (want, recent_raised) = if history {
            self.raised(b, planned, &recent)
        } else {
            // Without history, the day's peak stands in.
            let day = self.peaks(now - LEARNING_S);
            let raised = !day.is_empty();
            (day, raised)
        };
        let mut want = files::nest(&want);
        for &bytes in pending {
            let c = class_of(bytes, self.goal.ceiling);
            let w = want.entry(c).or_insert(0);
            *w = w.saturating_add(c);
        }
        let mut capped_by = None;
        if files::total(&want) >= self.goal.ceiling && files::total(&want) > 0 {
            files::cut_to(&mut want, self.goal.ceiling);
            capped_by = Some("ceiling");
        }
        if files::cut_to(&mut want, inputs.free_share) {
            capped_by = Some("free memory");
        }
        Target {
            bytes: files::total(&want),
            files: files::as_counts(&want),
            why: Why {
                bucket: bucket_name(b),
                planned: planned_bytes,
                cold_hour: history && planned_bytes == 0,
                recent_peak: files::total(&recent),
                recent_raised,
                pending: pending.iter().fold(0u64, |a, &p| a.saturating_add(p)),
                horizon_s: self.horizon_s,
                capped_by,
                planned_rate: self.planned_rate,
            },
        }
    }

    /// `planned` raised by the last hour's needs (`recent`) where they are more than the
    /// samples bucket `b`'s plan was made from ever saw (a burst the forecast did not see).
    fn raised(&self, b: usize, mut planned: Files, recent: &Files) -> (Files, bool) {
        let mut raised = false;
        for (&c, &peak) in recent {
            let seen = self.planned_max[b].get(&c).copied().unwrap_or(0);
            if peak > seen && peak > planned.get(&c).copied().unwrap_or(0) {
                planned.insert(c, peak);
                raised = true;
            }
        }
        (planned, raised)
    }

    /// The largest need of each class since `from_s`.
    fn peaks(&self, from_s: f64) -> Files {
        let mut out = Files::new();
        for &(_, c, d) in self.recent.iter().filter(|&&(t, _, _)| t >= from_s) {
            let e = out.entry(c).or_insert(0);
            *e = (*e).max(d);
        }
        out
    }
}
