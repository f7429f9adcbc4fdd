//! The charts written beside `docs/benchmarks.md` (`docs/bench/*.svg`):
//! req/s and CPU per request per contender and scenario (horizontal bars,
//! long labels read left of them), and the open-loop latency percentiles.

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

/// Where the charts go, and how docs/benchmarks.md links them.
pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bench");
pub const LINK_DIR: &str = "bench";

/// One bar: its label, and its stacked parts (one per series).
pub struct Bar {
    pub label: String,
    pub parts: Vec<f64>,
    /// Colour index of a one-series bar (the contender).
    pub colour: usize,
}

/// One line of the percentile chart.
pub struct Line {
    pub label: String,
    /// p50, p90, p99, p99.9 in µs.
    pub us: [f64; 4],
}

fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 9] = [
        RGBColor(0x4e, 0x79, 0xa7),
        RGBColor(0xf2, 0x8e, 0x2b),
        RGBColor(0xe1, 0x57, 0x59),
        RGBColor(0x76, 0xb7, 0xb2),
        RGBColor(0x59, 0xa1, 0x4f),
        RGBColor(0xed, 0xc9, 0x48),
        RGBColor(0xb0, 0x7a, 0xa1),
        RGBColor(0x9c, 0x75, 0x5f),
        RGBColor(0x79, 0x70, 0x6e),
    ];
    C[i % C.len()]
}

fn path(file: &str) -> PathBuf {
    Path::new(DIR).join(file)
}

/// Horizontal bars, top to bottom in `bars`' order; with several `series`
/// the parts are stacked and a legend names them, else each bar has its
/// contender's colour.
pub fn bars(file: &str, title: &str, x_desc: &str, series: &[&str], bars: &[Bar]) -> String {
    let out = path(file);
    if let Err(e) = draw_bars(&out, title, x_desc, series, bars) {
        println!("load harness: chart {file} not written: {e}");
    }
    format!("{LINK_DIR}/{file}")
}

fn draw_bars(
    out: &Path,
    title: &str,
    x_desc: &str,
    series: &[&str],
    bars: &[Bar],
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(DIR)?;
    let n = bars.len().max(1);
    let height = 90 + 22 * n as u32;
    let root = SVGBackend::new(out, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = bars
        .iter()
        .map(|b| b.parts.iter().filter(|v| v.is_finite()).sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.08;
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(330)
        .build_cartesian_2d(0f64..max, (0..n).into_segmented())?;
    // Bar i is drawn at row n-1-i so the first bar is on top.
    let row = |i: usize| n - 1 - i;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(r) if *r < n => labels[n - 1 - r].clone(),
            _ => String::new(),
        })
        .x_desc(x_desc)
        .x_label_formatter(&|v| crate::figures::thousands(*v))
        .label_style(("sans-serif", 12))
        .draw()?;
    let stacked = series.len() > 1;
    for (s, name) in series.iter().enumerate() {
        let rects: Vec<_> = bars
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let v = *b.parts.get(s)?;
                if !v.is_finite() || v <= 0.0 {
                    return None;
                }
                let from: f64 = b.parts[..s].iter().filter(|v| v.is_finite()).sum();
                let c = if stacked { colour(s) } else { colour(b.colour) };
                let mut r = Rectangle::new(
                    [
                        (from, SegmentValue::Exact(row(i))),
                        (from + v, SegmentValue::Exact(row(i) + 1)),
                    ],
                    c.filled(),
                );
                r.set_margin(3, 3, 0, 0);
                Some(r)
            })
            .collect();
        let drawn = chart.draw_series(rects)?;
        if stacked {
            let c = colour(s);
            drawn
                .label(*name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
        }
    }
    if stacked {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Latency percentiles, one line per run, on a log scale.
pub fn percentiles(file: &str, title: &str, lines: &[Line]) -> String {
    let out = path(file);
    if let Err(e) = draw_percentiles(&out, title, lines) {
        println!("load harness: chart {file} not written: {e}");
    }
    format!("{LINK_DIR}/{file}")
}

fn draw_percentiles(
    out: &Path,
    title: &str,
    lines: &[Line],
) -> Result<(), Box<dyn std::error::Error>> {
    const NAMES: [&str; 4] = ["p50", "p90", "p99", "p99.9"];
    std::fs::create_dir_all(DIR)?;
    // The legend goes below the chart, where it hides no line.
    let legend_height = 16 + 18 * lines.len() as u32;
    let root = SVGBackend::new(out, (900, 460 + legend_height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(460);
    let all = lines
        .iter()
        .flat_map(|l| l.us)
        .filter(|v| v.is_finite() && *v > 0.0);
    let max = all.clone().fold(1.0, f64::max) * 1.5;
    let min = all.fold(max, f64::min).max(1.0) / 1.5;
    let mut chart = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .margin_right(40)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(0i32..3i32, (min..max).log_scale())?;
    chart
        .configure_mesh()
        .x_labels(4)
        .x_label_formatter(&|x| NAMES.get(*x as usize).copied().unwrap_or("").to_owned())
        .y_label_formatter(&|v| crate::figures::thousands(*v))
        .y_desc("latency, µs (log scale)")
        .label_style(("sans-serif", 12))
        .draw()?;
    for (i, l) in lines.iter().enumerate() {
        let c = colour(i);
        let points: Vec<(i32, f64)> =
            l.us.iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite() && **v > 0.0)
                .map(|(x, v)| (x as i32, *v))
                .collect();
        chart.draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))?;
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, c.filled())))?;
        let y = 8 + 18 * i as i32;
        bottom.draw(&PathElement::new(
            [(90, y + 6), (115, y + 6)],
            c.stroke_width(2),
        ))?;
        bottom.draw(&Text::new(
            l.label.clone(),
            (122, y),
            ("sans-serif", 12).into_font(),
        ))?;
    }
    root.present()?;
    Ok(())
}
