//! Charts shaped like their data, drawn with plotters as SVG:
//!
//! ```text
//!   Lines     a number against a number (pages/s against vCPUs)
//!   Bars      a value per category and group (a table's cells × policies),
//!             a run with no value labelled as such, published figures as
//!             reference ticks
//!   Timeline  panels on one time axis, one unit each, and bands (the pause)
//! ```
//!
//! Every data mark carries a class (see [`marks`]), so a page's reader can
//! count the marks against the JSON's values.

mod bars;
mod lines;
pub mod marks;
mod timeline;

pub use bars::{Bar, Bars, Reference};
pub use lines::{Plot, Series};
pub use timeline::{Band, Panel, Shape, Timeline};

use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use serde::Serialize;

/// The series' colours, in order.
pub(crate) const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

/// One chart of a report.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Chart {
    /// Lines over a numeric x axis.
    Lines(Plot),
    /// Grouped bars over categories.
    Bars(Bars),
    /// Panels on one time axis.
    Timeline(Timeline),
}

impl From<Plot> for Chart {
    fn from(p: Plot) -> Self {
        Chart::Lines(p)
    }
}

impl From<Bars> for Chart {
    fn from(b: Bars) -> Self {
        Chart::Bars(b)
    }
}

impl From<Timeline> for Chart {
    fn from(t: Timeline) -> Self {
        Chart::Timeline(t)
    }
}

impl Chart {
    /// Its caption.
    pub fn title(&self) -> &str {
        match self {
            Chart::Lines(p) => &p.title,
            Chart::Bars(b) => &b.title,
            Chart::Timeline(t) => &t.title,
        }
    }

    /// Its kind's name, as the page's `data-kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Chart::Lines(_) => "lines",
            Chart::Bars(_) => "bars",
            Chart::Timeline(_) => "timeline",
        }
    }

    /// How many data marks it draws (elements of class `mark`).
    pub fn marks(&self) -> usize {
        match self {
            Chart::Lines(p) => p.marks(),
            Chart::Bars(b) => b.marks(),
            Chart::Timeline(t) => t.marks(),
        }
    }

    /// The chart as SVG, its data marks tagged.
    pub fn to_svg(&self) -> Result<String, String> {
        match self {
            Chart::Lines(p) => p.to_svg(),
            Chart::Bars(b) => b.to_svg(),
            Chart::Timeline(t) => t.to_svg(),
        }
    }
}

/// Draws with `draw` on a white SVG of `size` pixels, and tags its marks.
pub(crate) fn svg_string(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>,
) -> Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        draw(&root)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(marks::tag(&out))
}

/// One series as a chart draws it: its line through `path`, named in the
/// legend, and a mark at each of `points` (the data; the path may add the
/// corners of steps).
pub(crate) struct Line<'a> {
    pub label: &'a str,
    pub path: Vec<(f64, f64)>,
    pub points: &'a [(f64, f64)],
    pub color: RGBColor,
    /// A published figure: dashed, with marks of class `reference`.
    pub reference: bool,
    /// The marks' radius, pixels.
    pub radius: i32,
}

/// Draws `line` on `chart`.
pub(crate) fn draw_line<CT>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, CT>,
    line: Line<'_>,
) -> Result<(), String>
where
    CT: CoordTranslate<From = (f64, f64)>,
{
    let Line {
        label,
        path,
        points,
        color,
        reference,
        radius,
    } = line;
    let style = color.stroke_width(2);
    let drawn = if reference {
        chart.draw_series(DashedLineSeries::new(path, 6, 4, style))
    } else {
        chart.draw_series(LineSeries::new(path, style))
    };
    drawn
        .map_err(|e| e.to_string())?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    let drawn = if reference {
        let mark = marks::reference(color).filled();
        chart.draw_series(
            points
                .iter()
                .map(|&p| TriangleMarker::new(p, radius + 1, mark)),
        )
    } else {
        let mark = marks::value(color).filled();
        chart.draw_series(points.iter().map(|&p| Circle::new(p, radius, mark)))
    };
    drawn.map(|_| ()).map_err(|e| e.to_string())
}
