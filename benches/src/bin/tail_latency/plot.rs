//! The TTFT CDF plot (SVG, log x axis): the whole distribution above, the tail below.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;

use crate::upstream::BoxError;

/// Step-function points `(ms, cumulative fraction)` of a microsecond histogram, from `floor` up.
fn cdf(h: &Histogram<u64>, floor: f64) -> Vec<(f64, f64)> {
    let mut pts = Vec::new();
    let mut prev = 0.0_f64;
    for v in h.iter_recorded() {
        let x = v.value_iterated_to() as f64 / 1e3;
        let y = v.percentile() / 100.0;
        pts.push((x, prev.max(floor)));
        pts.push((x, y.max(floor)));
        prev = y;
    }
    pts
}

/// Writes `path`: one line per series.
pub(crate) fn ttft_cdf(
    path: &Path,
    title: &str,
    series: &[(&str, &Histogram<u64>)],
) -> Result<(), BoxError> {
    let nonempty = || series.iter().filter(|(_, h)| !h.is_empty());
    let lo = nonempty()
        .map(|(_, h)| h.min() as f64 / 1e3)
        .fold(f64::INFINITY, f64::min);
    let hi = nonempty()
        .map(|(_, h)| h.max() as f64 / 1e3)
        .fold(0.0, f64::max);
    if !lo.is_finite() || hi <= 0.0 {
        return Ok(());
    }
    let (lo, hi) = ((lo * 0.8).max(0.1), hi * 1.25);
    let root = SVGBackend::new(path, (1000, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(450);
    let panels = [
        (upper, 0.0, format!("{title}: TTFT CDF per strategy")),
        (lower, 0.9, format!("{title}: the tail (CDF from 0.9)")),
    ];
    for (area, floor, caption) in panels {
        let mut chart = ChartBuilder::on(&area)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d((lo..hi).log_scale(), floor..1.0)?;
        chart
            .configure_mesh()
            .x_desc("time to first token, ms (log scale), from the scheduled send time")
            .y_desc("fraction of requests")
            .draw()?;
        for (i, (name, h)) in nonempty().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(cdf(h, floor), color.stroke_width(2)))?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
