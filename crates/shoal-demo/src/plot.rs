//! The scenario's traffic timeline as an SVG (plotters, SVG backend only: no fonts or system
//! libraries needed): requests per second, ok and failed, with vertical markers for drain
//! commits and kills and a band for the authority outage.

use std::path::Path;

use plotters::prelude::*;

/// What a vertical marker stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// Authority commit of a DRAINING transition.
    DrainCommit,
    /// `kill -9` of a backend.
    KillBackend,
    /// `kill -9` of an agent.
    KillAgent,
}

impl MarkerKind {
    const ALL: [MarkerKind; 3] = [Self::DrainCommit, Self::KillBackend, Self::KillAgent];

    fn label(self) -> &'static str {
        match self {
            Self::DrainCommit => "DRAINING commit",
            Self::KillBackend => "kill -9 backend",
            Self::KillAgent => "kill -9 agent",
        }
    }

    fn style(self) -> ShapeStyle {
        match self {
            Self::DrainCommit => RGBColor(110, 110, 110).mix(0.45).stroke_width(1),
            Self::KillBackend => RGBColor(200, 0, 160).stroke_width(2),
            Self::KillAgent => RGBColor(110, 40, 170).stroke_width(2),
        }
    }
}

/// One vertical marker at `t_ms` (unix ms).
#[derive(Debug, Clone, Copy)]
pub struct Marker {
    /// Unix ms.
    pub t_ms: u64,
    /// What happened.
    pub kind: MarkerKind,
}

/// What to draw: request outcomes, markers, and the authority outage window.
#[derive(Debug, Default)]
pub struct Timeline {
    /// `(t_ms, ok)` per request.
    pub requests: Vec<(u64, bool)>,
    /// Vertical markers.
    pub markers: Vec<Marker>,
    /// Authority outage `(from_ms, to_ms)`, if the run had one.
    pub outage: Option<(u64, u64)>,
}

const SIZE: (u32, u32) = (1200, 500);
const OK_COLOR: RGBColor = RGBColor(31, 119, 180);
const FAILED_COLOR: RGBColor = RGBColor(214, 39, 40);
const OUTAGE_COLOR: RGBColor = RGBColor(255, 160, 40);

/// Requests per whole second since `t0_ms`: (ok, failed).
fn per_second(requests: &[(u64, bool)], t0_ms: u64) -> (Vec<u64>, Vec<u64>) {
    let secs = requests
        .iter()
        .map(|(t, _)| t.saturating_sub(t0_ms) / 1000)
        .max()
        .map_or(0, |m| m as usize + 1);
    let (mut ok, mut failed) = (vec![0u64; secs], vec![0u64; secs]);
    for (t, good) in requests {
        let i = (t.saturating_sub(t0_ms) / 1000) as usize;
        if *good {
            ok[i] += 1;
        } else {
            failed[i] += 1;
        }
    }
    (ok, failed)
}

fn fail(e: impl std::fmt::Debug) -> anyhow::Error {
    anyhow::anyhow!("timeline svg: {e:?}")
}

/// Writes the timeline to `path`. x: seconds since the first request; y: requests/s.
pub fn timeline_svg(path: &Path, title: &str, tl: &Timeline) -> anyhow::Result<()> {
    let t0 = tl.requests.iter().map(|(t, _)| *t).min().unwrap_or(0);
    let (mut ok, mut failed) = per_second(&tl.requests, t0);
    // The clients stop mid-second: the last bucket is partial and would read as a drop.
    if ok.len() > 1 {
        ok.pop();
        failed.pop();
    }
    let x = |t_ms: u64| t_ms.saturating_sub(t0) as f64 / 1000.0;
    let xmax = (ok.len() as f64).max(1.0);
    // Headroom above the traffic line for the legend.
    let ymax = ok.iter().chain(&failed).copied().max().unwrap_or(0).max(1) as f64 * 1.6;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(fail)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(fail)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_desc("time since the first request (s)")
        .y_desc("requests per second")
        .draw()
        .map_err(fail)?;
    if let Some((from, to)) = tl.outage {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x(from), 0.0), (x(to), ymax)],
                OUTAGE_COLOR.mix(0.18).filled(),
            )))
            .map_err(fail)?
            .label("authority outage (all replicas stopped)")
            .legend(|(lx, ly)| {
                Rectangle::new(
                    [(lx, ly - 5), (lx + 18, ly + 5)],
                    OUTAGE_COLOR.mix(0.4).filled(),
                )
            });
    }
    for kind in MarkerKind::ALL {
        let at: Vec<f64> = tl
            .markers
            .iter()
            .filter(|m| m.kind == kind)
            .map(|m| x(m.t_ms))
            .collect();
        if at.is_empty() {
            continue;
        }
        let style = kind.style();
        chart
            .draw_series(
                at.into_iter()
                    .map(move |mx| PathElement::new(vec![(mx, 0.0), (mx, ymax)], style)),
            )
            .map_err(fail)?
            .label(kind.label())
            .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 18, ly)], style));
    }
    let points = |v: &[u64]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .map(|(i, &n)| (i as f64 + 0.5, n as f64))
            .collect()
    };
    chart
        .draw_series(LineSeries::new(points(&ok), OK_COLOR.stroke_width(2)))
        .map_err(fail)?
        .label("ok")
        .legend(|(lx, ly)| {
            PathElement::new(vec![(lx, ly), (lx + 18, ly)], OK_COLOR.stroke_width(2))
        });
    chart
        .draw_series(LineSeries::new(
            points(&failed),
            FAILED_COLOR.stroke_width(1),
        ))
        .map_err(fail)?
        .label("failed")
        .legend(|(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 18, ly)], FAILED_COLOR));
    // Failures are rare: circle every second that had one so a single failure is visible.
    chart
        .draw_series(
            points(&failed)
                .into_iter()
                .filter(|(_, n)| *n > 0.0)
                .map(|p| Circle::new(p, 4, FAILED_COLOR.filled())),
        )
        .map_err(fail)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(fail)?;
    root.present().map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_buckets_by_whole_seconds_from_t0() {
        let reqs = [(1_000, true), (1_999, true), (2_000, false), (4_500, true)];
        let (ok, failed) = per_second(&reqs, 1_000);
        assert_eq!(ok, vec![2, 0, 0, 1]);
        assert_eq!(failed, vec![0, 1, 0, 0]);
    }

    #[test]
    fn writes_an_svg_with_markers_and_outage() {
        let dir = std::env::temp_dir().join(format!("shoal-demo-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.svg");
        let tl = Timeline {
            requests: (0..300).map(|i| (10_000 + i * 50, i != 123)).collect(),
            markers: vec![
                Marker {
                    t_ms: 12_000,
                    kind: MarkerKind::DrainCommit,
                },
                Marker {
                    t_ms: 20_000,
                    kind: MarkerKind::KillAgent,
                },
            ],
            outage: Some((15_000, 18_000)),
        };
        timeline_svg(&path, "test", &tl).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("kill -9 agent") && svg.contains("authority outage"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
