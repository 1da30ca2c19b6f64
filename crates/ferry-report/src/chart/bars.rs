//! Grouped bars over categories: for data whose x is a name (a table's
//! cells, a workload's mixes), a bar per group (policy) in each category,
//! on plotters' categorical axis nested with the groups.
//!
//! A run with no value (it did not converge) is drawn as its own labelled
//! mark at the baseline, never as a bar: a bar at the time limit would be
//! read as a migration that took that long.

use super::{marks, svg_string, COLORS};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Serialize;

/// One group's result in one category.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bar {
    /// A value, in the chart's unit.
    Value(f64),
    /// A run with no value, and why (e.g. "did not converge").
    NoValue(String),
    /// Not run (a group left out of this category): named in grey, not a
    /// mark.
    NotRun,
}

/// A published figure to draw next to one bar.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reference {
    /// Index into the categories.
    pub category: usize,
    /// Index into the groups.
    pub group: usize,
    /// The figure, in the chart's unit.
    pub value: f64,
}

/// Grouped bars.
#[derive(Clone, Debug, Serialize)]
pub struct Bars {
    /// Caption.
    pub title: String,
    /// The value axis's label, with its unit.
    pub y_label: String,
    /// The x axis: one name per category.
    pub categories: Vec<String>,
    /// The bars in each category (their legend).
    pub groups: Vec<String>,
    /// `values[category][group]`.
    pub values: Vec<Vec<Bar>>,
    /// Published figures, drawn as a tick across their bar.
    pub references: Vec<Reference>,
    /// The legend's name for the references (e.g. "the seed's figure").
    pub reference_label: String,
}

impl Bars {
    /// The data marks it draws: a bar per value, a labelled mark per run
    /// with no value.
    pub fn marks(&self) -> usize {
        self.values
            .iter()
            .flatten()
            .filter(|b| !matches!(b, Bar::NotRun))
            .count()
    }

    /// The chart as SVG.
    pub fn to_svg(&self) -> Result<String, String> {
        svg_string((900, 520), |root| self.draw(root))
    }

    fn top(&self) -> f64 {
        let values = self.values.iter().flatten().filter_map(|b| match b {
            Bar::Value(v) => Some(*v),
            _ => None,
        });
        let refs = self.references.iter().map(|r| r.value);
        let max = values.chain(refs).fold(0.0f64, f64::max);
        // Headroom for the value labels and the legend above the bars.
        if max > 0.0 {
            max * 1.4
        } else {
            1.0
        }
    }

    fn draw(
        &self,
        root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    ) -> Result<(), String> {
        let n = self.categories.len().max(1);
        let groups = self.groups.len().max(1) as f64;
        let top = self.top();
        // Each category's slot runs 0..groups + 1: a bar per group, and
        // half a bar's gap either side.
        // The categories: a discrete axis whose values are their indices
        // (a usize range includes its end: n categories are 0..n-1), each
        // nesting a continuous 0..groups+1 for its bars.
        let x = (0..n - 1).nested_coord(move |_| 0.0..groups + 1.0);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x, 0.0..top)
            .map_err(|e| e.to_string())?;
        let names = &self.categories;
        let label = |v: &NestedValue<usize, f64>| match v {
            NestedValue::Category(i) => names.get(*i).cloned().unwrap_or_default(),
            NestedValue::Value(..) => String::new(),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .max_light_lines(2)
            .x_labels(n)
            .x_label_formatter(&label)
            .x_label_style(("sans-serif", 14))
            .y_desc(self.y_label.as_str())
            .draw()
            .map_err(|e| e.to_string())?;
        let at = |c: usize, g: f64| NestedValue::Value(c, g);
        for (g, name) in self.groups.iter().enumerate() {
            let color = COLORS[g % COLORS.len()];
            let left = g as f64 + 0.5;
            let bars = self
                .values
                .iter()
                .enumerate()
                .filter_map(|(c, row)| match row.get(g) {
                    Some(Bar::Value(v)) => Some(Rectangle::new(
                        [(at(c, left), *v), (at(c, left + 1.0), 0.0)],
                        marks::value(color).filled(),
                    )),
                    _ => None,
                });
            chart
                .draw_series(bars)
                .map_err(|e| e.to_string())?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
            for (c, row) in self.values.iter().enumerate() {
                let centre = at(c, left + 0.5);
                let v = match row.get(g) {
                    Some(Bar::Value(v)) => *v,
                    Some(Bar::NoValue(why)) => {
                        // An empty box at the baseline, crossed, and why.
                        let h = top * 0.05;
                        let stroke = marks::no_value(color).stroke_width(2);
                        chart
                            .draw_series([Rectangle::new(
                                [(at(c, left), h), (at(c, left + 1.0), 0.0)],
                                stroke,
                            )])
                            .map_err(|e| e.to_string())?;
                        chart
                            .draw_series([PathElement::new(
                                vec![(at(c, left), h), (at(c, left + 1.0), 0.0)],
                                color.stroke_width(1),
                            )])
                            .map_err(|e| e.to_string())?;
                        let style = ("sans-serif", 12)
                            .into_font()
                            .transform(FontTransform::Rotate270)
                            .color(&color)
                            .pos(Pos::new(HPos::Left, VPos::Center));
                        chart
                            .draw_series([Text::new(why.clone(), (centre.clone(), h * 1.3), style)])
                            .map_err(|e| e.to_string())?;
                        continue;
                    }
                    Some(Bar::NotRun) => {
                        // Named in grey, so a group left out is not
                        // mistaken for a gap: not a mark, no value.
                        let style = ("sans-serif", 11)
                            .into_font()
                            .transform(FontTransform::Rotate270)
                            .color(&RGBColor(150, 150, 150))
                            .pos(Pos::new(HPos::Left, VPos::Center));
                        chart
                            .draw_series([Text::new("not run", (centre, top * 0.02), style)])
                            .map_err(|e| e.to_string())?;
                        continue;
                    }
                    None => continue,
                };
                let style = ("sans-serif", 11)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom));
                chart
                    .draw_series([Text::new(format_value(v), (centre, v), style)])
                    .map_err(|e| e.to_string())?;
            }
        }
        if !self.references.is_empty() {
            let tick = marks::reference(BLACK);
            let refs = self.references.iter().map(|r| {
                let left = r.group as f64 + 0.5;
                PathElement::new(
                    vec![
                        (at(r.category, left - 0.15), r.value),
                        (at(r.category, left + 1.15), r.value),
                    ],
                    tick.stroke_width(3),
                )
            });
            chart
                .draw_series(refs)
                .map_err(|e| e.to_string())?
                .label(self.reference_label.as_str())
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 14, y)], BLACK.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// A bar's value as its label: three significant digits at most.
fn format_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
