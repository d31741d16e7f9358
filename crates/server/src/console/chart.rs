//! Line charts as server-rendered SVG: the overview draws them from the store's own rows, so
//! they work without Prometheus or JavaScript.

use maud::{Markup, html};

const WIDTH: u64 = 600;
const HEIGHT: u64 = 160;
const PAD: u64 = 24;
/// One colour per series, in order (presentation attributes: the CSP allows no inline style).
const COLOURS: [&str; 6] = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#d62728", "#8c564b"];

/// A chart of `series` over `steps` equal steps of time, each series one polyline; `labels`
/// name the first and the last step.
pub fn line_chart(id: &str, title: &str, labels: (&str, &str), steps: usize, series: &[(&str, Vec<u64>)]) -> Markup {
    let top = series.iter().flat_map(|(_, v)| v.iter().copied()).max().unwrap_or(0).max(1);
    let (plot_w, plot_h) = (WIDTH - 2 * PAD, HEIGHT - 2 * PAD);
    let x = |i: usize| PAD + plot_w * i as u64 / (steps.max(2) - 1) as u64;
    let y = |v: u64| PAD + plot_h - plot_h * v.min(top) / top;
    let points = |values: &[u64]| -> String {
        (0..steps).map(|i| format!("{},{}", x(i), y(values.get(i).copied().unwrap_or(0)))).collect::<Vec<_>>().join(" ")
    };
    html! {
        figure.chart {
            figcaption { (title) }
            svg #(id) xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img" aria-label=(title) {
                line x1=(PAD) y1=(PAD + plot_h) x2=(PAD + plot_w) y2=(PAD + plot_h) stroke="#888" {}
                line x1=(PAD) y1=(PAD) x2=(PAD) y2=(PAD + plot_h) stroke="#888" {}
                text x="2" y=(PAD) font-size="10" { (top) }
                text x="2" y=(PAD + plot_h) font-size="10" { "0" }
                text x=(PAD) y=(HEIGHT - 6) font-size="10" { (labels.0) }
                text x=(PAD + plot_w) y=(HEIGHT - 6) font-size="10" text-anchor="end" { (labels.1) }
                @for (i, (name, values)) in series.iter().enumerate() {
                    polyline.series data-series=(name) data-total=(values.iter().sum::<u64>())
                        points=(points(values)) fill="none" stroke=(COLOURS[i % COLOURS.len()]) stroke-width="2" {
                        title { (name) }
                    }
                    text x=(PAD + 10 + 110 * i as u64) y="14" font-size="11" fill=(COLOURS[i % COLOURS.len()]) { (name) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u2_a_chart_draws_one_line_per_series_scaled_to_the_largest_value() {
        let svg =
            line_chart("c", "Mail", ("-24h", "now"), 3, &[("Sent", vec![0, 4, 2]), ("Seen", vec![1, 0])]).into_string();
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        // Sent: x at 24, 300, 576; 4 is the top (y 24), 0 the floor (y 136), 2 half way.
        assert!(svg.contains("points=\"24,136 300,24 576,80\""), "{svg}");
        assert!(svg.contains("points=\"24,108 300,136 576,136\""), "a missing step is 0: {svg}");
        assert!(svg.contains("data-series=\"Sent\" data-total=\"6\""), "{svg}");
        let empty = line_chart("e", "Jobs", ("a", "b"), 24, &[]).into_string();
        assert_eq!(empty.matches("<polyline").count(), 0);
    }
}
