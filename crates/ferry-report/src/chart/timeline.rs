//! A migration over time: panels stacked on one time axis, one unit per
//! panel (a rate in MiB/s, bytes left in MiB, a throttle in %), and bands
//! across every panel for spans such as the pause. Four units on one y
//! axis had flattened the throttle, the thing a policy changes, to a line
//! at 0.

use super::lines::{bounds, Series};
use super::{draw_line, marks, svg_string, Line, COLORS};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Serialize;

/// One panel: its unit and its lines.
#[derive(Clone, Debug, Serialize)]
pub struct Panel {
    /// The y axis's label: what and in which unit.
    pub y_label: String,
    /// How its points are joined.
    pub shape: Shape,
    /// The lines, every one in that unit.
    pub series: Vec<Series>,
}

/// How a panel's points are joined.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// Straight lines.
    Line,
    /// Each value holds from its point to the next (a setting changed at
    /// that time: a throttle).
    StepAfter,
    /// Each value held since the point before (an average over a span that
    /// ended then: a round's rate).
    StepBefore,
}

impl Shape {
    /// The line through `points` on an axis from `x0` to `x1`.
    fn path(self, points: &[(f64, f64)], x0: f64, x1: f64) -> Vec<(f64, f64)> {
        let mut out = Vec::with_capacity(points.len() * 2 + 1);
        match self {
            Shape::Line => out.extend_from_slice(points),
            Shape::StepAfter => {
                for (i, &(x, y)) in points.iter().enumerate() {
                    if i > 0 {
                        out.push((x, points[i - 1].1));
                    }
                    out.push((x, y));
                }
                if let Some(&(_, y)) = points.last() {
                    out.push((x1, y));
                }
            }
            Shape::StepBefore => {
                let mut from = x0;
                for &(x, y) in points {
                    out.push((from, y));
                    out.push((x, y));
                    from = x;
                }
            }
        }
        out
    }
}

/// A span of time drawn across every panel.
#[derive(Clone, Debug, Serialize)]
pub struct Band {
    /// What it is ("pause 12 ms").
    pub label: String,
    /// Where it starts, on the time axis.
    pub from: f64,
    /// Where it ends.
    pub to: f64,
}

/// Panels sharing one time axis.
#[derive(Clone, Debug, Serialize)]
pub struct Timeline {
    /// Caption.
    pub title: String,
    /// The time axis's label, with its unit.
    pub x_label: String,
    /// Top to bottom.
    pub panels: Vec<Panel>,
    /// Spans drawn across every panel.
    pub bands: Vec<Band>,
}

/// The band's colour.
const BAND: RGBColor = RGBColor(120, 120, 120);
/// Height of one panel, pixels.
const PANEL_HEIGHT: u32 = 170;
/// Width of the plots, and of the legends' column right of them: a legend
/// inside a plot hid the data under it.
const PLOT_WIDTH: u32 = 860;
const LEGEND_WIDTH: u32 = 300;

impl Timeline {
    /// The data marks it draws: a point per sample, and a band per span
    /// in each panel.
    pub fn marks(&self) -> usize {
        self.panels
            .iter()
            .flat_map(|p| p.series.iter())
            .map(|s| s.points.len())
            .sum()
    }

    /// The chart as SVG.
    pub fn to_svg(&self) -> Result<String, String> {
        let height = 60 + PANEL_HEIGHT * self.panels.len().max(1) as u32;
        svg_string((PLOT_WIDTH + LEGEND_WIDTH, height), |root| self.draw(root))
    }

    fn draw(
        &self,
        root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    ) -> Result<(), String> {
        let all = self
            .panels
            .iter()
            .flat_map(|p| p.series.iter())
            .flat_map(|s| s.points.iter());
        let (mut x0, mut x1, _, _) = bounds(all);
        for b in &self.bands {
            x0 = x0.min(b.from);
            x1 = x1.max(b.to);
        }
        let root = root
            .titled(&self.title, ("sans-serif", 20))
            .map_err(|e| e.to_string())?;
        let areas = root.split_evenly((self.panels.len().max(1), 1));
        // A band narrower than this share of the axis is widened to it, so
        // that a 10 ms pause in a 10 s migration can be seen.
        let min_width = (x1 - x0) / 250.0;
        let last = self.panels.len().saturating_sub(1);
        for (k, (area, panel)) in areas.iter().zip(&self.panels).enumerate() {
            let (area, legend) = area.split_horizontally(PLOT_WIDTH);
            draw_legend(&legend, panel)?;
            let points = panel.series.iter().flat_map(|s| s.points.iter());
            let (_, _, _, y1) = bounds(points);
            let top = if y1 > 0.0 { y1 * 1.15 } else { 1.0 };
            let mut chart = ChartBuilder::on(&area)
                .margin_left(16)
                .margin_right(16)
                .margin_top(6)
                .x_label_area_size(if k == last { 40 } else { 14 })
                .y_label_area_size(70)
                .build_cartesian_2d(x0..x1, 0.0..top)
                .map_err(|e| e.to_string())?;
            let mut mesh = chart.configure_mesh();
            mesh.y_desc(panel.y_label.as_str())
                .y_labels(4)
                .max_light_lines(2);
            if k == last {
                mesh.x_desc(self.x_label.as_str());
            } else {
                mesh.x_label_formatter(&|_| String::new());
            }
            mesh.draw().map_err(|e| e.to_string())?;
            for (j, b) in self.bands.iter().enumerate() {
                let (from, to) = if b.to - b.from < min_width {
                    let mid = (b.from + b.to) / 2.0;
                    (mid - min_width / 2.0, mid + min_width / 2.0)
                } else {
                    (b.from, b.to)
                };
                chart
                    .draw_series([Rectangle::new(
                        [(from, 0.0), (to, top)],
                        marks::band(BAND).filled(),
                    )])
                    .map_err(|e| e.to_string())?;
                if k == 0 {
                    // Left of the band: a pause ends the axis. A line down
                    // each: the postcopy band starts where the pause ends.
                    let style = ("sans-serif", 12)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Right, VPos::Top));
                    let y = top * (1.0 - 0.1 * j as f64);
                    chart
                        .draw_series([Text::new(b.label.clone(), (from, y), style)])
                        .map_err(|e| e.to_string())?;
                }
            }
            for (i, s) in panel.series.iter().enumerate() {
                let line = Line {
                    label: &s.label,
                    path: panel.shape.path(&s.points, x0, x1),
                    points: &s.points,
                    color: COLORS[i % COLORS.len()],
                    reference: false,
                    radius: 2,
                };
                draw_line(&mut chart, line)?;
            }
        }
        Ok(())
    }
}

/// `panel`'s legend in `area`, beside its plot: a line in each series'
/// colour, and its label.
fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), String> {
    let style = ("sans-serif", 12)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    // Many series (a vCPU each) close up to fit the panel's height.
    let step = (PANEL_HEIGHT as i32 - 24) / panel.series.len().max(8) as i32;
    for (i, s) in panel.series.iter().enumerate() {
        let y = 16 + step * i as i32;
        let color = COLORS[i % COLORS.len()];
        area.draw(&PathElement::new(
            vec![(4, y), (24, y)],
            color.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?;
        area.draw(&Text::new(s.label.clone(), (30, y), style.clone()))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
