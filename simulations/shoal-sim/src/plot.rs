//! SVG plots (plotters, SVG backend only: no fonts or system libraries needed).

use std::path::Path;

use plotters::prelude::*;

use crate::report::Series;

/// A plot could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("plot {path}: {msg}")]
pub struct PlotError {
    path: String,
    msg: String,
}

fn err(path: &Path, e: impl std::fmt::Debug) -> PlotError {
    PlotError {
        path: path.display().to_string(),
        msg: format!("{e:?}"),
    }
}

const SIZE: (u32, u32) = (800, 480);
const BUCKETS: u64 = 50;

/// Histogram of `values` in up to 50 equal-width buckets.
pub fn histogram_svg(path: &Path, title: &str, values: &[u64]) -> Result<(), PlotError> {
    let max = values.iter().copied().max().unwrap_or(0);
    let width = (max / BUCKETS + 1).max(1);
    let mut counts = vec![0u64; (max / width + 1) as usize];
    for &v in values {
        counts[(v / width) as usize] += 1;
    }
    let ymax = counts.iter().copied().max().unwrap_or(0).max(1);
    let xmax = (counts.len() as u64 * width) as f64;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title} (n = {})", values.len()),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..(ymax as f64 * 1.05))
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(title)
        .y_desc("count")
        .draw()
        .map_err(|e| err(path, e))?;
    chart
        .draw_series(counts.iter().enumerate().map(|(i, &c)| {
            let x0 = (i as u64 * width) as f64;
            Rectangle::new(
                [(x0, 0.0), (x0 + width as f64, c as f64)],
                BLUE.mix(0.7).filled(),
            )
        }))
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}

/// Empirical CDF of `values`.
pub fn cdf_svg(path: &Path, title: &str, values: &[u64]) -> Result<(), PlotError> {
    let mut v = values.to_vec();
    v.sort_unstable();
    let n = v.len().max(1) as f64;
    let xmax = v.last().copied().unwrap_or(0).max(1) as f64;
    // At most ~2000 points so big samples stay small files.
    let stride = (v.len() / 2000).max(1);
    let points: Vec<(f64, f64)> = v
        .iter()
        .enumerate()
        .filter(|(i, _)| i % stride == 0 || *i + 1 == v.len())
        .map(|(i, &x)| (x as f64, (i + 1) as f64 / n))
        .collect();
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title} CDF (n = {})", values.len()),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax * 1.02, 0f64..1.0)
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(title)
        .y_desc("fraction <= x")
        .draw()
        .map_err(|e| err(path, e))?;
    chart
        .draw_series(LineSeries::new(points, &BLUE))
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}

/// A time series (x in seconds).
pub fn series_svg(path: &Path, title: &str, s: &Series) -> Result<(), PlotError> {
    let ymax = s.values.iter().copied().max().unwrap_or(0).max(1) as f64;
    let xmax = (s.values.len() as u64 * s.bucket_ms).max(1) as f64 / 1000.0;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title} per {} ms", s.bucket_ms),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax * 1.05)
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("virtual time (s)")
        .y_desc(title)
        .draw()
        .map_err(|e| err(path, e))?;
    let points = s
        .values
        .iter()
        .enumerate()
        .map(|(i, &v)| ((i as u64 * s.bucket_ms) as f64 / 1000.0, v as f64));
    chart
        .draw_series(LineSeries::new(points, &RED))
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}
