//! A small hand-written SVG line chart (no plotting dependency): one polyline per series,
//! optional logarithmic x axis, and horizontal reference lines for baselines.

use std::fmt::Write;

/// One line of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x, y)` points, in data units, drawn in the order given.
    pub points: Vec<(f64, f64)>,
}

/// A horizontal line across the whole plot, such as a baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceLine {
    /// Legend text.
    pub name: String,
    /// Height in data units.
    pub y: f64,
}

/// A line chart rendered to a standalone SVG document.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LineChart {
    /// Title above the plot.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Label beside the y axis.
    pub y_label: String,
    /// Whether x positions are logarithmic (all x must then be positive).
    pub log_x: bool,
    /// Ticks on the x axis: position in data units and label.
    pub x_ticks: Vec<(f64, String)>,
    /// The lines.
    pub series: Vec<Series>,
    /// Horizontal dashed lines.
    pub reference_lines: Vec<ReferenceLine>,
}

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
/// Distinguishable on white and in greyscale print.
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step giving about five intervals up to `max`.
fn nice_step(max: f64) -> f64 {
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * magnitude)
}

impl LineChart {
    /// Renders the chart as an SVG document.
    ///
    /// ```
    /// use hugeprep_bench::svg::{LineChart, Series};
    /// let chart = LineChart {
    ///     title: "GB/s".into(),
    ///     log_x: true,
    ///     series: vec![Series { name: "avx512-nt".into(), points: vec![(4096.0, 24.0), (2e6, 73.0)] }],
    ///     ..LineChart::default()
    /// };
    /// let svg = chart.render();
    /// assert!(svg.starts_with("<svg") && svg.contains("<polyline") && svg.contains("avx512-nt"));
    /// ```
    pub fn render(&self) -> String {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(self.x_ticks.iter().map(|t| t.0))
            .filter(|&x| !self.log_x || x > 0.0)
            .map(|x| if self.log_x { x.log10() } else { x });
        let (x_min, x_max) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        let (x_min, x_max) = if x_min.is_finite() && x_max > x_min {
            (x_min, x_max)
        } else if x_min.is_finite() {
            (x_min - 1.0, x_min + 1.0)
        } else {
            (0.0, 1.0)
        };
        let y_top = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .chain(self.reference_lines.iter().map(|r| r.y))
            .fold(0.0f64, f64::max);
        let y_step = nice_step(if y_top > 0.0 { y_top * 1.05 } else { 1.0 });
        let y_max = ((y_top * 1.05) / y_step).ceil().max(1.0) * y_step;
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;
        let px = |x: f64| {
            let x = if self.log_x { x.log10() } else { x };
            LEFT + (x - x_min) / (x_max - x_min) * plot_w
        };
        let py = |y: f64| TOP + plot_h - y / y_max * plot_h;

        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            svg,
            r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            LEFT + plot_w / 2.0,
            escape(&self.title)
        );
        // Grid and y ticks.
        let ticks = (y_max / y_step).round() as usize;
        for i in 0..=ticks {
            let y = i as f64 * y_step;
            let yy = py(y);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{y}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                yy + 4.0
            );
        }
        for (x, label) in &self.x_ticks {
            if self.log_x && *x <= 0.0 {
                continue;
            }
            let xx = px(*x);
            let _ = writeln!(
                svg,
                r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + plot_h,
                TOP + plot_h + 18.0,
                escape(label)
            );
        }
        let _ = writeln!(
            svg,
            r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            HEIGHT - 15.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            svg,
            r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            TOP + plot_h / 2.0,
            escape(&self.y_label)
        );

        let legend_x = LEFT + plot_w + 15.0;
        let mut legend_y = TOP + 10.0;
        for (i, series) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<String> = series
                .points
                .iter()
                .filter(|p| !self.log_x || p.0 > 0.0)
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                points.join(" ")
            );
            for point in &points {
                let (cx, cy) = point.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(svg, r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>"#);
            }
            let _ = writeln!(
                svg,
                r#"<line x1="{legend_x}" y1="{legend_y}" x2="{:.1}" y2="{legend_y}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                legend_x + 20.0,
                legend_x + 26.0,
                legend_y + 4.0,
                escape(&series.name)
            );
            legend_y += 18.0;
        }
        for (i, line) in self.reference_lines.iter().enumerate() {
            let color = if i == 0 { "#000" } else { "#777" };
            let yy = py(line.y);
            let _ = writeln!(
                svg,
                r#"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="{color}" stroke-width="1.5" stroke-dasharray="6 4"/>"#,
                LEFT + plot_w
            );
            let _ = writeln!(
                svg,
                r#"<line x1="{legend_x}" y1="{legend_y}" x2="{:.1}" y2="{legend_y}" stroke="{color}" stroke-width="1.5" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                legend_x + 20.0,
                legend_x + 26.0,
                legend_y + 4.0,
                escape(&line.name)
            );
            legend_y += 18.0;
        }
        svg.push_str("</svg>\n");
        svg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_land_inside_the_plot_and_text_is_escaped() {
        let chart = LineChart {
            title: "a <b> & c".into(),
            log_x: true,
            x_ticks: vec![(4096.0, "4 KiB".into()), (1073741824.0, "1 GiB".into())],
            series: vec![Series {
                name: "m".into(),
                points: vec![(4096.0, 10.0), (1073741824.0, 70.0)],
            }],
            reference_lines: vec![ReferenceLine {
                name: "kernel".into(),
                y: 11.5,
            }],
            ..LineChart::default()
        };
        let svg = chart.render();
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        let polyline = svg.lines().find(|l| l.starts_with("<polyline")).unwrap();
        let first = polyline.split("points=\"").nth(1).unwrap();
        let (x, _) = first.split_once(',').unwrap();
        assert_eq!(x, format!("{LEFT:.1}"));
        assert_eq!(svg.matches("stroke-dasharray").count(), 2);
    }

    #[test]
    fn an_empty_chart_still_renders() {
        let svg = LineChart::default().render();
        assert!(svg.ends_with("</svg>\n"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(100.0), 20.0);
        assert_eq!(nice_step(73.0), 20.0);
        assert_eq!(nice_step(12.0), 2.5);
    }
}
