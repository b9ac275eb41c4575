//! Renders panels of the Grafana dashboard (integration/prometheus/dashboard.json) from a real
//! Prometheus's `query_range` answers into SVG line charts, for docs/operations.md (Grafana is
//! not packaged for Debian). `scripts/dashboard-pictures` runs the daemon, Prometheus and a
//! lease load, then this:
//!
//! ```text
//! cargo run --example dashboard_pictures -- PROM_URL START END RATE_WINDOW OUT_DIR
//! ```
//!
//! Every target of every panel is queried as written, with `$instance` as `.*` and the `[5m]`
//! rate windows replaced by RATE_WINDOW (a run of minutes has no 5-minute history).

use std::time::Duration;

use hugeprep::placement::http::Http;
use hugeprep_bench::svg::{LineChart, Series};

fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The legend of one series: Grafana's `{{label}}` filled from its labels.
fn legend(format: &str, metric: &serde_json::Value) -> String {
    let mut out = format.to_string();
    if let Some(m) = metric.as_object() {
        for (k, v) in m {
            out = out.replace(&format!("{{{{{k}}}}}"), v.as_str().unwrap_or(""));
        }
    }
    out
}

/// Divides values to a readable unit.
fn scale(unit: &str) -> (f64, &'static str) {
    match unit {
        "bytes" => ((1u64 << 20) as f64, "MiB"),
        "Bps" => (1e9, "GB/s"),
        "s" => (1e-3, "ms"),
        "reqps" => (1.0, "per second"),
        _ => (1.0, ""),
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [prom, start, end, window, out] = args.as_slice() else {
        anyhow::bail!("usage: dashboard_pictures PROM_URL START END RATE_WINDOW OUT_DIR");
    };
    let (start, end): (f64, f64) = (start.parse()?, end.parse()?);
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/integration/prometheus/dashboard.json"
    ))?)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let http = Http::new(Duration::from_secs(30), None);
    std::fs::create_dir_all(out)?;
    let step = ((end - start) / 200.0).max(1.0);
    for panel in dash["panels"].as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or("panel");
        let unit = panel["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .unwrap_or("");
        let (divisor, unit_name) = scale(unit);
        let mut series = Vec::new();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap_or_default()
                .replace("$instance", ".*")
                .replace("[5m]", &format!("[{window}]"));
            let url = format!(
                "{prom}/api/v1/query_range?query={}&start={start}&end={end}&step={step}",
                escape(&expr)
            );
            let answer = rt.block_on(http.send("GET".parse()?, &url, &[], None))?;
            let v: serde_json::Value = serde_json::from_slice(&answer.body)?;
            anyhow::ensure!(v["status"] == "success", "{expr}: {v}");
            for s in v["data"]["result"].as_array().into_iter().flatten() {
                let points: Vec<(f64, f64)> = s["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| {
                        let t = p[0].as_f64()?;
                        let y: f64 = p[1].as_str()?.parse().ok()?;
                        y.is_finite().then_some((t - start, y / divisor))
                    })
                    .collect();
                // A series at zero all along (a reason that never happened) only crowds
                // the legend.
                if points.iter().any(|p| p.1 != 0.0) {
                    series.push(Series {
                        name: legend(target["legendFormat"].as_str().unwrap_or(""), &s["metric"]),
                        points,
                    });
                }
            }
        }
        if series.is_empty() {
            eprintln!("{title}: no data, not drawn");
            continue;
        }
        let x_ticks = (0..=((end - start) / 30.0) as u64)
            .map(|i| ((i * 30) as f64, format!("{}", i * 30)))
            .collect();
        let chart = LineChart {
            title: title.to_string(),
            x_label: "seconds into the run".into(),
            y_label: unit_name.into(),
            x_ticks,
            series,
            ..LineChart::default()
        };
        let name: String = title
            .to_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect::<String>()
            .split('-')
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join("-");
        let path = format!("{out}/{name}.svg");
        std::fs::write(&path, chart.render())?;
        println!("{path}");
    }
    Ok(())
}
