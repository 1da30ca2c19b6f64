//! Reports of ferry's experiments and migrations: a table shaped like the
//! seed's table for people, the raw numbers as JSON for machines, and an SVG
//! plot. Every experiment writes all three through [`Report::write`].

#![warn(missing_docs)]

use plotters::prelude::*;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Errors writing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The output directory or a file could not be written.
    #[error("cannot write {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The JSON could not be produced.
    #[error("cannot serialize results")]
    Json(#[from] serde_json::Error),
    /// plotters failed.
    #[error("cannot draw plot {path}: {message}")]
    Plot {
        /// The file.
        path: PathBuf,
        /// plotters' message.
        message: String,
    },
}

/// A text table with a title, aligned columns and free-form notes below it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Table {
    /// Printed above the table.
    pub title: String,
    /// Column headers.
    pub columns: Vec<String>,
    /// Cells, row by row.
    pub rows: Vec<Vec<String>>,
    /// Lines printed under the table (machine, caveats, ratios).
    pub notes: Vec<String>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(title: impl Into<String>, columns: &[&str]) -> Self {
        Table {
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            ..Table::default()
        }
    }

    /// Appends a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Appends a note.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Renders the table with `+---+` borders, like the seeds' tables.
    pub fn render(&self) -> String {
        let ncol = self.columns.len();
        let mut width: Vec<usize> = self.columns.iter().map(|c| c.len()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(ncol) {
                width[i] = width[i].max(cell.len());
            }
        }
        let rule: String = width.iter().fold(String::from("+"), |mut s, w| {
            s.push_str(&"-".repeat(w + 2));
            s.push('+');
            s
        });
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, w) in width.iter().enumerate() {
                let cell = cells.get(i).map(String::as_str).unwrap_or("");
                let _ = write!(s, " {cell:>w$} |");
            }
            s
        };
        let mut out = String::new();
        if !self.title.is_empty() {
            let _ = writeln!(out, "{}", self.title);
        }
        let _ = writeln!(out, "{rule}");
        let _ = writeln!(out, "{}", line(&self.columns));
        let _ = writeln!(out, "{rule}");
        for row in &self.rows {
            let _ = writeln!(out, "{}", line(row));
        }
        let _ = writeln!(out, "{rule}");
        for note in &self.notes {
            let _ = writeln!(out, "{note}");
        }
        out
    }
}

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
}

impl Plot {
    /// Draws the plot into `path` as SVG (for experiments that write more
    /// than their report's one plot, such as a timeline per run).
    pub fn write_svg(&self, path: &Path) -> Result<(), ReportError> {
        draw(self, path).map_err(|message| ReportError::Plot {
            path: path.to_path_buf(),
            message,
        })
    }
}

/// A finished experiment: tables to print, raw results, and a plot.
#[derive(Debug)]
pub struct Report<T: Serialize> {
    /// File stem, e.g. `zap` gives `zap.json` and `zap.svg`.
    pub name: String,
    /// Tables, printed in order.
    pub tables: Vec<Table>,
    /// Raw results, written as JSON.
    pub results: T,
    /// The plot.
    pub plot: Plot,
}

/// Where a report was written.
#[derive(Debug, Clone)]
pub struct Written {
    /// The JSON file.
    pub json: PathBuf,
    /// The SVG file.
    pub svg: PathBuf,
}

impl<T: Serialize> Report<T> {
    /// All tables, rendered.
    pub fn render(&self) -> String {
        self.tables
            .iter()
            .map(Table::render)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Writes `<dir>/<name>.json` (results and tables) and `<dir>/<name>.svg`.
    pub fn write(&self, dir: &Path) -> Result<Written, ReportError> {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let json = dir.join(format!("{}.json", self.name));
        let body = serde_json::json!({
            "experiment": self.name,
            "results": serde_json::to_value(&self.results)?,
            "tables": self.tables,
        });
        std::fs::write(&json, serde_json::to_string_pretty(&body)?).map_err(|source| {
            ReportError::Io {
                path: json.clone(),
                source,
            }
        })?;
        let svg = dir.join(format!("{}.svg", self.name));
        draw(&self.plot, &svg).map_err(|message| ReportError::Plot {
            path: svg.clone(),
            message,
        })?;
        Ok(Written { json, svg })
    }
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

fn draw(plot: &Plot, path: &Path) -> Result<(), String> {
    let points = plot.series.iter().flat_map(|s| s.points.iter());
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
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(&plot.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70);
    macro_rules! finish {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(plot.x_label.as_str())
                .y_desc(plot.y_label.as_str())
                .draw()
                .map_err(|e| e.to_string())?;
            for (i, s) in plot.series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(
                        s.points.iter().copied(),
                        color.stroke_width(2),
                    ))
                    .map_err(|e| e.to_string())?
                    .label(s.label.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
                chart
                    .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| e.to_string())?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }};
    }
    if plot.log_y {
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
    root.present().map_err(|e| e.to_string())
}

/// `a / b` as `"12.3x"`, or `"n/a"` when `b` is zero.
pub fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        "n/a".into()
    } else {
        format!("{:.1}x", a / b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new("demo", &["vCPUs", "time (ms)"]);
        t.row(vec!["1".into(), "3.34".into()]);
        t.row(vec!["16".into(), "10.06".into()]);
        let text = t.render();
        assert!(text.contains("|     1 |      3.34 |"), "{text}");
        assert!(text.contains("|    16 |     10.06 |"), "{text}");
    }

    #[test]
    fn report_writes_json_and_svg() {
        let dir = std::env::temp_dir().join(format!("ferry-report-{}", std::process::id()));
        let report = Report {
            name: "unit".into(),
            tables: vec![Table::new("t", &["a"])],
            results: vec![1, 2, 3],
            plot: Plot {
                title: "p".into(),
                x_label: "x".into(),
                y_label: "y".into(),
                log_y: true,
                series: vec![Series {
                    label: "s".into(),
                    points: vec![(1.0, 1.0), (2.0, 10.0)],
                }],
            },
        };
        let w = report.write(&dir).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&w.json).unwrap()).unwrap();
        assert_eq!(json["results"][2], 3);
        assert!(std::fs::read_to_string(&w.svg).unwrap().contains("<svg"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
