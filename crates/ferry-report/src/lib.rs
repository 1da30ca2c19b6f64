//! Reports of ferry's experiments and migrations: a table shaped like the
//! seed's table for people, the raw numbers as JSON for machines, charts
//! shaped like their data, and one HTML page that holds them all. Every
//! experiment writes them through [`Report::write`].

#![warn(missing_docs)]

pub mod chart;
pub mod html;
mod table;

pub use chart::{Band, Bar, Bars, Chart, Panel, Plot, Reference, Series, Shape, Timeline};
pub use table::Table;

use serde::Serialize;
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

impl Plot {
    /// Draws the plot into `path` as SVG (for experiments that write more
    /// than their report's charts, such as a timeline per run).
    pub fn write_svg(&self, path: &Path) -> Result<(), ReportError> {
        Chart::from(self.clone()).write_svg(path)
    }
}

impl Chart {
    /// Draws the chart into `path` as SVG.
    pub fn write_svg(&self, path: &Path) -> Result<(), ReportError> {
        let svg = self.to_svg().map_err(|message| ReportError::Plot {
            path: path.to_path_buf(),
            message,
        })?;
        write_file(path, svg.as_bytes())
    }
}

/// A finished experiment: tables to print, raw results, and charts.
#[derive(Debug)]
pub struct Report<T: Serialize> {
    /// File stem, e.g. `zap` gives `zap.json`, `zap.svg` and `zap.html`.
    pub name: String,
    /// Tables, printed in order.
    pub tables: Vec<Table>,
    /// Raw results, written as JSON.
    pub results: T,
    /// Charts, in order (the first is also `<name>.svg`).
    pub charts: Vec<Chart>,
}

/// Where a report was written.
#[derive(Debug, Clone)]
pub struct Written {
    /// The JSON file.
    pub json: PathBuf,
    /// The first chart's SVG file.
    pub svg: PathBuf,
    /// The page: `<dir>/report.html`.
    pub html: PathBuf,
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

    /// Writes `<dir>/<name>.json` (results and tables), each chart as
    /// `<dir>/<name>.svg`, `<name>-2.svg`, ..., and the page holding them
    /// all as `<dir>/<name>.html` and `<dir>/report.html`: the last report
    /// written to the directory, with links to the other reports' pages
    /// there (`bench converge` then `bench fleet` into one `--out` keep
    /// both, each a link away).
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
            "charts": self.charts,
        });
        write_file(&json, serde_json::to_string_pretty(&body)?.as_bytes())?;
        let svg = dir.join(format!("{}.svg", self.name));
        for (i, chart) in self.charts.iter().enumerate() {
            match i {
                0 => chart.write_svg(&svg)?,
                _ => chart.write_svg(&dir.join(format!("{}-{}.svg", self.name, i + 1)))?,
            }
        }
        let json_name = format!("{}.json", self.name);
        let own = format!("{}.html", self.name);
        let others = other_reports(dir, &own);
        let render = |others: &[String], path: &Path| {
            html::Page {
                title: &self.name,
                intro: &[],
                tables: &self.tables,
                charts: &self.charts,
                json: Some(&json_name),
                others,
            }
            .render()
            .map_err(|message| ReportError::Plot {
                path: path.to_path_buf(),
                message,
            })
        };
        let page = dir.join(&own);
        write_file(&page, render(&[], &page)?.as_bytes())?;
        let html = dir.join("report.html");
        write_file(&html, render(&others, &html)?.as_bytes())?;
        Ok(Written { json, svg, html })
    }
}

/// The pages of other reports in `dir` (a `<stem>.html` beside its
/// `<stem>.json`), by file name, sorted; `own` and `report.html` left out.
fn other_reports(dir: &Path, own: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != own && n != "report.html")
        .filter(|n| {
            n.strip_suffix(".html")
                .is_some_and(|stem| dir.join(format!("{stem}.json")).is_file())
        })
        .collect();
    found.sort();
    found
}

/// Writes `bytes` to `path`.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    std::fs::write(path, bytes).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })
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
            charts: vec![Plot {
                title: "p".into(),
                x_label: "x".into(),
                y_label: "y".into(),
                log_y: true,
                references: Vec::new(),
                series: vec![Series {
                    label: "s".into(),
                    points: vec![(1.0, 1.0), (2.0, 10.0)],
                }],
            }
            .into()],
        };
        let w = report.write(&dir).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&w.json).unwrap()).unwrap();
        assert_eq!(json["results"][2], 3);
        let svg = std::fs::read_to_string(&w.svg).unwrap();
        assert!(svg.contains("<svg"));
        assert_eq!(chart::marks::count(&svg, "mark"), 2, "a mark per point");
        let page = std::fs::read_to_string(&w.html).unwrap();
        assert!(page.contains("href=\"unit.json\""), "{page}");
        assert!(!page.contains("class=\"others\""), "alone: {page}");
        // A second report into the same directory: report.html is its page,
        // with a link to the first's, which stays.
        let second = Report {
            name: "other".into(),
            tables: vec![Table::new("t2", &["b"])],
            results: vec![4],
            charts: Vec::new(),
        };
        let w2 = second.write(&dir).unwrap();
        let page = std::fs::read_to_string(&w2.html).unwrap();
        assert!(page.contains("data-title=\"t2\""), "{page}");
        assert!(
            page.contains("<a href=\"unit.html\">unit.html</a>"),
            "{page}"
        );
        let first = std::fs::read_to_string(dir.join("unit.html")).unwrap();
        assert!(first.contains("data-title=\"t\""), "{first}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
