//! Rendering a [`ClearBenchReport`]: the human table, the policy check and the SVG chart.

use std::fmt::Write;

use super::clear_results::{ClearBenchReport, KernelResult, MethodResult};
use super::svg::{LineChart, ReferenceLine, Series};
use hugeprep::clear::{ClearPurpose, Method};
use hugeprep::page_size::PageSize;
use hugeprep::stats::Summary;
use hugeprep::units::format_bytes;

/// Chunks from this size up are where the policy's method must be within 10% of the best.
pub const POLICY_CHECK_MIN_CHUNK: usize = 2 << 20;

/// The policy's method against the best method measured at one chunk size and thread count.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyVerdict {
    /// Bytes per kernel call.
    pub chunk_bytes: usize,
    /// Worker threads.
    pub threads: usize,
    /// The policy's method's median, GB/s.
    pub policy_gbps: f64,
    /// The fastest method at this chunk and thread count.
    pub best: Method,
    /// Its median, GB/s.
    pub best_gbps: f64,
    /// The kernel's fault-in of fresh 2 MiB pages at the same thread count, GB/s.
    pub kernel_2m_gbps: Option<f64>,
    /// The policy's method against the best method, each repetition against the same
    /// repetition of the other (see [`hugeprep::stats::Summary::paired_ratio`]), capped at 1,
    /// and that method. `None` when the samples are not there (reports from before they
    /// were kept).
    pub paired: Option<(f64, Method)>,
}

impl PolicyVerdict {
    /// The policy's fraction of the best: the paired ratio when there is one (steadier on a
    /// shared host), else the ratio of the medians.
    pub fn fraction(&self) -> f64 {
        self.paired.map_or_else(
            || self.policy_gbps / self.best_gbps.max(f64::MIN_POSITIVE),
            |(f, _)| f,
        )
    }

    /// Whether the policy's method is within `tolerance` (0.10: 10%) of the best, by
    /// [`PolicyVerdict::fraction`].
    pub fn within(&self, tolerance: f64) -> bool {
        self.fraction() >= 1.0 - tolerance
    }
}

impl ClearBenchReport {
    fn result(&self, method: Method, chunk: usize, threads: usize) -> Option<&MethodResult> {
        self.results
            .iter()
            .find(|r| r.method == method && r.chunk_bytes == chunk && r.threads == threads)
    }

    fn kernel_result(&self, page_size: PageSize, threads: usize) -> Option<&KernelResult> {
        self.kernel
            .iter()
            .find(|k| k.page_size == page_size && k.threads == threads)
    }

    fn thread_counts(&self) -> Vec<usize> {
        let mut t: Vec<usize> = self
            .results
            .iter()
            .map(|r| r.threads)
            .chain(self.kernel.iter().map(|k| k.threads))
            .collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    fn chunk_sizes(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self.results.iter().map(|r| r.chunk_bytes).collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    fn methods(&self) -> Vec<Method> {
        let mut m: Vec<Method> = Vec::new();
        for r in &self.results {
            if !m.contains(&r.method) {
                m.push(r.method);
            }
        }
        m
    }

    /// For every chunk of at least 2 MiB and every thread count: the policy's method against
    /// the best measured. Empty when the report has no policy or the policy's method was not
    /// measured.
    pub fn policy_verdicts(&self) -> Vec<PolicyVerdict> {
        let Some(policy) = &self.policy else {
            return Vec::new();
        };
        let mut verdicts = Vec::new();
        for chunk in self.chunk_sizes() {
            if chunk < POLICY_CHECK_MIN_CHUNK {
                continue;
            }
            for threads in self.thread_counts() {
                let Some(mine) = self.result(policy.method, chunk, threads) else {
                    continue;
                };
                let Some(best) = self
                    .results
                    .iter()
                    .filter(|r| r.chunk_bytes == chunk && r.threads == threads)
                    .max_by(|a, b| a.gbps.median.total_cmp(&b.gbps.median))
                else {
                    continue;
                };
                // Against the best method by median, repetition by repetition (each pair ran
                // in the same interleaved round); the policy's own method compares at 100%.
                let paired = if best.method == policy.method {
                    Some((1.0, best.method))
                } else {
                    Summary::paired_ratio(&mine.samples_gbps, &best.samples_gbps)
                        .map(|f| (f.min(1.0), best.method))
                };
                verdicts.push(PolicyVerdict {
                    paired,
                    chunk_bytes: chunk,
                    threads,
                    policy_gbps: mine.gbps.median,
                    best: best.method,
                    best_gbps: best.gbps.median,
                    kernel_2m_gbps: self
                        .kernel_result(PageSize::Size2M, threads)
                        .map(|k| k.gbps.median),
                });
            }
        }
        verdicts
    }

    /// The human-readable table: rows method x chunk, columns thread counts, each cell the
    /// median (range) in GB/s and the ratio to the kernel's fault-in of fresh 2 MiB pages at
    /// the same thread count; then the baselines, the policy check and the notes.
    pub fn table(&self) -> String {
        let threads = self.thread_counts();
        let mut rows: Vec<Vec<String>> = Vec::new();
        let mut header = vec!["method".to_string(), "chunk".to_string()];
        header.extend(
            threads
                .iter()
                .map(|t| format!("{t} thread{}", if *t == 1 { "" } else { "s" })),
        );
        rows.push(header);
        for method in self.methods() {
            for chunk in self.chunk_sizes() {
                let mut row = vec![method.to_string(), format_bytes(chunk as u64)];
                for &t in &threads {
                    row.push(match self.result(method, chunk, t) {
                        Some(r) => {
                            let ratio = self
                                .kernel_result(PageSize::Size2M, t)
                                .filter(|k| k.gbps.median > 0.0)
                                .map(|k| format!(" {:.1}x", r.gbps.median / k.gbps.median))
                                .unwrap_or_default();
                            format!("{}{ratio}", r.gbps)
                        }
                        None => "-".to_string(),
                    });
                }
                rows.push(row);
            }
        }
        for page_size in PageSize::ALL {
            if !self.kernel.iter().any(|k| k.page_size == page_size) {
                continue;
            }
            let mut row = vec!["kernel fault-in".to_string(), format!("{page_size} pages")];
            for &t in &threads {
                row.push(
                    self.kernel_result(page_size, t)
                        .map_or("-".to_string(), |k| k.gbps.to_string()),
                );
            }
            rows.push(row);
        }

        let mut out = String::new();
        let backing = if self.hugepage_backed {
            "2M-hugepage-backed"
        } else {
            "ordinary (not hugepage-backed)"
        };
        let _ = writeln!(
            out,
            "Clearing a {} {backing} buffer chunk by chunk: GB/s median (min-max) of {} runs after a warm-up;\n\
             Nx = ratio to the kernel's fault-in of fresh 2M pages at the same thread count. CPUs: {:?}\n",
            format_bytes(self.buffer_bytes as u64),
            self.reps,
            self.cpus
        );
        render_rows(&mut out, &rows);

        if let Some(policy) = &self.policy {
            let _ = writeln!(
                out,
                "\nIn use: {} (rule: {}), against the best method at chunks >= {}:",
                policy.method,
                policy.rule,
                format_bytes(POLICY_CHECK_MIN_CHUNK as u64)
            );
            let mut rows = vec![vec![
                "chunk".to_string(),
                "threads".to_string(),
                "in use".to_string(),
                "best".to_string(),
                "in use/best (medians)".to_string(),
                "in use/best (paired)".to_string(),
                "in use/kernel 2M".to_string(),
            ]];
            for v in self.policy_verdicts() {
                rows.push(vec![
                    format_bytes(v.chunk_bytes as u64),
                    v.threads.to_string(),
                    format!("{:.1}", v.policy_gbps),
                    format!("{:.1} ({})", v.best_gbps, v.best),
                    format!(
                        "{:.0}%",
                        100.0 * v.policy_gbps / v.best_gbps.max(f64::MIN_POSITIVE)
                    ),
                    format!(
                        "{}{}",
                        v.paired
                            .map_or("-".to_string(), |(f, m)| format!("{:.0}% ({m})", f * 100.0)),
                        if v.within(0.10) { "" } else { " (>10% below)" }
                    ),
                    v.kernel_2m_gbps
                        .filter(|k| *k > 0.0)
                        .map_or("-".to_string(), |k| format!("{:.1}x", v.policy_gbps / k)),
                ]);
            }
            if rows.len() > 1 {
                render_rows(&mut out, &rows);
            } else {
                let _ = writeln!(out, "  (policy method not measured at these chunks)");
            }
            self.purposes_table(&mut out, &threads);
            out += &self.goals_text();
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        out
    }

    /// The plan in use timed for a scrub (always streams) and for use-soon memory (cached
    /// below `nt_min_extent`), per chunk size and thread count.
    fn purposes_table(&self, out: &mut String, threads: &[usize]) {
        if self.purposes.is_empty() {
            return;
        }
        let Some(policy) = &self.policy else {
            return;
        };
        let _ = writeln!(
            out,
            "\nThe plan in use by purpose (scrub: always {}; use-soon: rep-stosb below nt_min_extent = {}):",
            policy.method,
            format_bytes(policy.plan.nt_min_extent as u64)
        );
        let mut rows = vec![vec!["purpose".to_string(), "chunk".to_string()]];
        rows[0].extend(threads.iter().map(|t| format!("{t} thr")));
        for purpose in [ClearPurpose::Scrub, ClearPurpose::UseSoon] {
            for chunk in self.chunk_sizes() {
                let cells: Vec<_> = threads
                    .iter()
                    .map(|&t| {
                        self.purposes.iter().find(|p| {
                            p.purpose == purpose && p.chunk_bytes == chunk && p.threads == t
                        })
                    })
                    .collect();
                let Some(used) = cells.iter().flatten().next().map(|p| p.method_used) else {
                    continue;
                };
                let mut row = vec![format!("{purpose} ({used})"), format_bytes(chunk as u64)];
                row.extend(
                    cells
                        .iter()
                        .map(|c| c.map_or("-".to_string(), |p| p.gbps.to_string())),
                );
                rows.push(row);
            }
        }
        render_rows(out, &rows);
    }

    /// A chart of GB/s per method against chunk size (log x axis) at the largest thread count
    /// measured, with the kernel's fault-in baselines as horizontal lines.
    pub fn svg(&self) -> String {
        let threads = self.thread_counts().into_iter().max().unwrap_or(1);
        let series = self
            .methods()
            .into_iter()
            .map(|method| Series {
                name: method.to_string(),
                points: self
                    .results
                    .iter()
                    .filter(|r| r.method == method && r.threads == threads)
                    .map(|r| (r.chunk_bytes as f64, r.gbps.median))
                    .collect(),
            })
            .collect();
        let reference_lines = PageSize::ALL
            .into_iter()
            .filter_map(|p| self.kernel_result(p, threads))
            .map(|k| ReferenceLine {
                name: format!("kernel fault-in {}", k.page_size),
                y: k.gbps.median,
            })
            .collect();
        LineChart {
            title: format!(
                "Clearing throughput, {threads} thread{}, {} {}buffer",
                if threads == 1 { "" } else { "s" },
                format_bytes(self.buffer_bytes as u64),
                if self.hugepage_backed {
                    "2M-hugepage "
                } else {
                    ""
                }
            ),
            x_label: "bytes per kernel call (chunk)".into(),
            y_label: "GB/s (median)".into(),
            log_x: true,
            x_ticks: self
                .chunk_sizes()
                .into_iter()
                .map(|c| (c as f64, format_bytes(c as u64)))
                .collect(),
            series,
            reference_lines,
        }
        .render()
    }
}

/// Left-aligned columns separated by two spaces.
fn render_rows(out: &mut String, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::super::clear::PolicyChoice;
    use super::super::Summary;
    use super::*;

    fn summary(median: f64) -> Summary {
        Summary {
            median,
            min: median - 1.0,
            max: median + 1.0,
        }
    }

    fn report() -> ClearBenchReport {
        let mut results = Vec::new();
        for (method, gbps) in [(Method::RepStosb, 70.0), (Method::Avx512Nt, 73.0)] {
            for chunk in [4096, 2 << 20] {
                for threads in [1, 2] {
                    results.push(MethodResult {
                        method,
                        chunk_bytes: chunk,
                        threads,
                        gbps: summary(gbps * threads as f64),
                        samples_gbps: Vec::new(),
                    });
                }
            }
        }
        ClearBenchReport {
            policy: Some(PolicyChoice::rule_only(
                hugeprep::clear::ClearPlan::always(Method::RepStosb),
                "pending",
            )),
            buffer_bytes: 8 << 20,
            hugepage_backed: true,
            reps: 5,
            cpus: vec![0, 1],
            results,
            purposes: Vec::new(),
            goals: Vec::new(),
            kernel: vec![KernelResult {
                page_size: PageSize::Size2M,
                threads: 1,
                gbps: summary(11.5),
            }],
            notes: vec!["chunk 1 GiB skipped".into()],
        }
    }

    #[test]
    fn table_shows_ratios_policy_and_notes() {
        let table = report().table();
        assert!(table.contains("73.0 (72.0-74.0) 6.3x"), "{table}");
        assert!(
            table.contains("kernel fault-in  2M pages  11.5 (10.5-12.5)"),
            "{table}"
        );
        assert!(
            table.contains("In use: rep-stosb (rule: pending)"),
            "{table}"
        );
        assert!(table.contains("96%"), "{table}");
        assert!(table.contains("note: chunk 1 GiB skipped"), "{table}");
    }

    #[test]
    fn verdicts_cover_large_chunks_only() {
        let verdicts = report().policy_verdicts();
        assert_eq!(verdicts.len(), 2);
        assert!(verdicts.iter().all(|v| v.chunk_bytes == 2 << 20));
        assert!(verdicts
            .iter()
            .all(|v| v.best == Method::Avx512Nt && v.within(0.10)));
        assert_eq!(verdicts[0].kernel_2m_gbps, Some(11.5));
    }

    #[test]
    fn chart_has_a_line_per_method_at_max_threads() {
        let svg = report().svg();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("2 threads"));
        assert!(svg.contains("2 MiB"));
    }

    #[test]
    fn json_has_the_documented_shape() {
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(json["policy"]["method"], "rep-stosb");
        assert_eq!(json["policy"]["rule"], "pending");
        let first = &json["results"][0];
        assert_eq!(first["method"], "rep-stosb");
        assert_eq!(first["chunk_bytes"], 4096);
        assert_eq!(first["threads"], 1);
        assert_eq!(first["gbps"]["median"], 70.0);
        assert_eq!(json["kernel"][0]["page_size"], "2M");
        assert_eq!(json["kernel"][0]["gbps"]["min"], 10.5);
    }
}
