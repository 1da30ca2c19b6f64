//! Lines over a numeric x axis: for data whose x is a number (vCPUs,
//! hosts, pages), each point a mark.

use super::{draw_line, svg_string, Line, COLORS};
use plotters::prelude::*;
use serde::Serialize;

/// The references' colours: greys, so a published curve never passes
/// for one of ours.
const REFERENCE_COLORS: [RGBColor; 2] = [RGBColor(90, 90, 90), RGBColor(160, 160, 160)];

/// One line of a plot.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A line plot with one or more series.
#[derive(Clone, Debug, Serialize)]
pub struct Plot {
    /// Caption.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Logarithmic y axis (for results spanning decades).
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
    /// Published figures to compare with (a seed's), drawn dashed in grey
    /// with marks of class `reference`, not `mark`.
    pub references: Vec<Series>,
}

impl Plot {
    /// The data marks it draws: one per point.
    pub fn marks(&self) -> usize {
        self.series.iter().map(|s| s.points.len()).sum()
    }

    /// The plot as SVG.
    pub fn to_svg(&self) -> Result<String, String> {
        svg_string((900, 560), |root| self.draw(root))
    }

    fn draw(
        &self,
        root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    ) -> Result<(), String> {
        let all = self.series.iter().chain(&self.references);
        let (x0, x1, y0, y1) = bounds(all.flat_map(|s| s.points.iter()));
        let mut builder = ChartBuilder::on(root);
        builder
            .caption(&self.title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(70);
        macro_rules! finish {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(self.x_label.as_str())
                    .y_desc(self.y_label.as_str())
                    .draw()
                    .map_err(|e| e.to_string())?;
                let ours = self
                    .series
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (s, false, COLORS[i % COLORS.len()]));
                let refs = self
                    .references
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (s, true, REFERENCE_COLORS[i % REFERENCE_COLORS.len()]));
                for (s, reference, color) in ours.chain(refs) {
                    let line = Line {
                        label: &s.label,
                        path: s.points.clone(),
                        points: &s.points,
                        color,
                        reference,
                        radius: 3,
                    };
                    draw_line(&mut chart, line)?;
                }
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| e.to_string())?;
            }};
        }
        if self.log_y {
            let lo = if y0 > 0.0 { y0 / 2.0 } else { 1e-3 };
            let chart = builder
                .build_cartesian_2d(x0..x1, (lo..(y1.max(lo) * 2.0)).log_scale())
                .map_err(|e| e.to_string())?;
            finish!(chart);
        } else {
            let top = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
            let chart = builder
                .build_cartesian_2d(x0..x1, 0.0..top)
                .map_err(|e| e.to_string())?;
            finish!(chart);
        }
        Ok(())
    }
}

/// The x and y extent of `points` (a unit square if there are none, and
/// never an empty x range).
pub(crate) fn bounds<'a>(points: impl Iterator<Item = &'a (f64, f64)>) -> (f64, f64, f64, f64) {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    (x0, x1, y0, y1)
}
