//! One row per figure: what was measured, the DESIGN §11 target, and the ratio to it.

use std::time::Duration;

pub struct Row {
    pub id: &'static str,
    pub what: String,
    pub figure: String,
    pub target: String,
    /// Figure ÷ target, or `None` for a row that only explains another.
    pub ratio: Option<f64>,
    pub met: bool,
}

impl Row {
    /// A time that must stay at or under `target`.
    pub fn time(id: &'static str, what: impl Into<String>, figure: Duration, target: Duration) -> Row {
        let ratio = figure.as_secs_f64() / target.as_secs_f64();
        Row {
            id,
            what: what.into(),
            figure: format!("{:.3} ms", figure.as_secs_f64() * 1e3),
            target: format!("≤ {} ms", target.as_millis()),
            ratio: Some(ratio),
            met: ratio <= 1.0,
        }
    }

    /// A quantity that must stay at or under `target`.
    pub fn at_most(id: &'static str, what: impl Into<String>, figure: f64, target: f64, unit: &str) -> Row {
        Row {
            id,
            what: what.into(),
            figure: format!("{figure:.1} {unit}"),
            target: format!("≤ {target} {unit}"),
            ratio: Some(figure / target),
            met: figure <= target,
        }
    }

    /// A quantity that must reach at least `target`.
    pub fn at_least(id: &'static str, what: impl Into<String>, figure: f64, target: f64, unit: &str) -> Row {
        Row {
            id,
            what: what.into(),
            figure: format!("{figure:.2} {unit}"),
            target: format!("≥ {target} {unit}"),
            ratio: Some(figure / target),
            met: figure >= target,
        }
    }

    /// A figure with no target of its own (a baseline, a spread).
    pub fn note(id: &'static str, what: impl Into<String>, figure: impl Into<String>) -> Row {
        Row { id, what: what.into(), figure: figure.into(), target: String::new(), ratio: None, met: true }
    }
}

pub fn print(rows: &[Row]) {
    println!();
    println!("| id | what | figure | target | ratio | |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        let (ratio, verdict) = match r.ratio {
            Some(x) => (format!("{x:.3}"), if r.met { "met" } else { "MISSED" }),
            None => (String::new(), ""),
        };
        println!("| {} | {} | {} | {} | {ratio} | {verdict} |", r.id, r.what, r.figure, r.target);
    }
}

/// The `p`-th percentile (0.0–1.0) of some durations.
pub fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v.get(((v.len().saturating_sub(1)) as f64 * p).round() as usize).copied().unwrap_or_default()
}
