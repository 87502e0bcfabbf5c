//! Plots as inline SVG, drawn on the server: no script, no build step. Only numbers and the
//! page's own labels go into them (escaped all the same).

use maud::{Markup, html};

/// Width and height of a plot, in SVG units.
const W: f64 = 320.0;
const H: f64 = 80.0;

/// A line of `points` (x, y), x from the first to the last, y from 0 to the largest, with the
/// largest y written in the corner as `label` says.
pub fn line(points: &[(f64, f64)], label: &str) -> Markup {
    line_sized(points, label, W, H)
}

/// As [`line()`], `w` by `h` (a sparkline in a table row).
pub fn line_sized(points: &[(f64, f64)], label: &str, w: f64, h: f64) -> Markup {
    let max_y = points.iter().map(|p| p.1).fold(0.0_f64, f64::max);
    let (min_x, max_x) = match (points.first(), points.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => (a.0, b.0),
        _ => (0.0, 1.0),
    };
    let scale_y = if max_y > 0.0 { (h - 12.0) / max_y } else { 0.0 };
    let coords: Vec<String> = points
        .iter()
        .map(|&(x, y)| {
            let px = (x - min_x) / (max_x - min_x) * w;
            let py = h - y * scale_y;
            format!("{px:.1},{py:.1}")
        })
        .collect();
    html! {
        svg class="plot" viewBox={"0 0 " (w) " " (h)} width=(w) height=(h) role="img" aria-label=(label) {
            rect x="0" y="0" width=(w) height=(h) class="frame" {}
            @if coords.len() > 1 {
                polyline points=(coords.join(" ")) class="series" {}
            }
            text x="4" y="11" class="label" { (label) ": max " (format_number(max_y)) }
        }
    }
}

/// Bars of (succeeded, failed) per slot, failures stacked on top, scaled to the largest.
pub fn bars(slots: &[(usize, usize)], label: &str) -> Markup {
    let largest = slots.iter().map(|&(s, f)| s + f).max().unwrap_or(0);
    let max = largest.max(1) as f64;
    let n = slots.len().max(1) as f64;
    let width = W / n;
    let scale = (H - 12.0) / max;
    html! {
        svg class="plot" viewBox={"0 0 " (W) " " (H)} width=(W) height=(H) role="img" aria-label=(label) {
            rect x="0" y="0" width=(W) height=(H) class="frame" {}
            @for (i, &(ok, failed)) in slots.iter().enumerate() {
                @let x = i as f64 * width;
                @let ok_h = ok as f64 * scale;
                @let failed_h = failed as f64 * scale;
                rect x=(format!("{:.1}", x + 1.0)) y=(format!("{:.1}", H - ok_h))
                    width=(format!("{:.1}", (width - 2.0).max(1.0))) height=(format!("{ok_h:.1}")) class="ok" {}
                rect x=(format!("{:.1}", x + 1.0)) y=(format!("{:.1}", H - ok_h - failed_h))
                    width=(format!("{:.1}", (width - 2.0).max(1.0))) height=(format!("{failed_h:.1}")) class="failed" {}
            }
            text x="4" y="11" class="label" { (label) ": max " (largest) " a minute" }
        }
    }
}

fn format_number(n: f64) -> String {
    if n.fract() == 0.0 {
        format!("{n:.0}")
    } else {
        format!("{n:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_spans_the_plot_and_labels_its_largest_value() {
        let svg = line(&[(0.0, 0.0), (5.0, 10.0), (10.0, 5.0)], "ready").into_string();
        assert!(
            svg.contains("points=\"0.0,80.0 160.0,12.0 320.0,46.0\""),
            "{svg}"
        );
        assert!(svg.contains("ready: max 10</text>"), "{svg}");
        // As the history gives them: seconds before now, the newest at 0.
        let svg = line(&[(-20.0, 2.5), (-10.0, 0.0), (0.0, 1.0)], "age").into_string();
        assert!(
            svg.contains("points=\"0.0,12.0 160.0,80.0 320.0,52.8\""),
            "{svg}"
        );
        assert!(svg.contains("age: max 2.5</text>"), "{svg}");
        // Points at one time, or all at zero: nothing divides by zero.
        for points in [[(5.0, 1.0), (5.0, 2.0)], [(1.0, 0.0), (2.0, 0.0)]] {
            let svg = line(&points, "x").into_string();
            assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        }
        let small = line_sized(&[(0.0, 1.0), (1.0, 2.0)], "q", 160.0, 36.0).into_string();
        assert!(small.contains("points=\"0.0,24.0 160.0,12.0\""), "{small}");
        // One point or none draws no line, and nothing divides by zero.
        assert!(!line(&[(3.0, 0.0)], "x").into_string().contains("polyline"));
        assert!(!line(&[], "x").into_string().contains("NaN"));
    }

    #[test]
    fn bars_stack_failures_on_successes() {
        let svg = bars(&[(6, 2), (0, 0)], "done").into_string();
        assert!(svg.contains("height=\"51.0\""), "{svg}");
        assert!(svg.contains("height=\"17.0\""), "{svg}");
        assert!(svg.contains("done: max 8 a minute"));
        // Four slots share the width: each bar 320 / 4 wide, less a margin of 1 each side.
        let svg = bars(&[(1, 0), (1, 0), (1, 0), (1, 0)], "n").into_string();
        assert!(
            svg.contains("x=\"241.0\" y=\"12.0\" width=\"78.0\""),
            "{svg}"
        );
    }
}
