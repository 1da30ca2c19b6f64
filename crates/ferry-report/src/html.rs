//! One self-contained HTML page per run: the tables, the charts inline as
//! SVG, and a link to the JSON. No script and no font from anywhere: the
//! page opens from a file, offline, and shows the same thing everywhere.
//!
//! ```text
//!   <table class="ferry-table" data-title=…>   a Table, cell for cell
//!   <figure class="chart" data-kind=… data-marks=N [data-panels=a|b|…]>
//!        <svg>…</svg>                          N elements of class "mark",
//!                                              a timeline's panels' units
//!   <a class="json" href=…>                    the raw results
//!   <p class="others">                         report.html only: the other
//!                                              reports' pages beside it
//! ```

use crate::chart::Chart;
use crate::table::Table;
use std::fmt::Write as _;

/// A page to render.
pub struct Page<'a> {
    /// Its heading and title.
    pub title: &'a str,
    /// Lines under the heading (what ran, where).
    pub intro: &'a [String],
    /// Tables, in order.
    pub tables: &'a [Table],
    /// Charts, in order.
    pub charts: &'a [Chart],
    /// The JSON's file name, next to the page.
    pub json: Option<&'a str>,
    /// Other reports' pages beside it, by file name, linked at its top.
    pub others: &'a [String],
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:960px;color:#222}\
table{border-collapse:collapse;margin:1em 0;font-size:14px}\
th,td{border:1px solid #bbb;padding:3px 8px;text-align:right}\
th{background:#eee}caption{font-weight:bold;text-align:left;padding:4px 0}\
p.note{font-size:13px;color:#444;margin:2px 0}\
figure{margin:1.5em 0}figcaption{font-size:13px;color:#444}\
svg{max-width:100%;height:auto}";

impl Page<'_> {
    /// The page, charts drawn.
    pub fn render(&self) -> Result<String, String> {
        let mut out = String::new();
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <title>{t}</title><style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n",
            t = escape(self.title)
        );
        for line in self.intro {
            let _ = writeln!(out, "<p>{}</p>", escape(line));
        }
        if !self.others.is_empty() {
            let links: Vec<String> = self
                .others
                .iter()
                .map(|o| format!("<a href=\"{0}\">{0}</a>", escape(o)))
                .collect();
            let _ = writeln!(
                out,
                "<p class=\"others\">Other reports in this directory: {}.</p>",
                links.join(", ")
            );
        }
        if let Some(json) = self.json {
            let _ = writeln!(
                out,
                "<p><a class=\"json\" href=\"{j}\">{j}</a>: every number on this page, and more.</p>",
                j = escape(json)
            );
        }
        for t in self.tables {
            table(&mut out, t);
        }
        for c in self.charts {
            let svg = c.to_svg()?;
            let panels = match c {
                Chart::Timeline(t) => {
                    let units: Vec<&str> = t.panels.iter().map(|p| p.y_label.as_str()).collect();
                    format!(" data-panels=\"{}\"", escape(&units.join("|")))
                }
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "<figure class=\"chart\" data-kind=\"{}\" data-marks=\"{}\"{panels}>\n{}\n<figcaption>{}</figcaption></figure>",
                c.kind(),
                c.marks(),
                strip_prolog(&svg),
                escape(c.title())
            );
        }
        out.push_str("</body></html>\n");
        Ok(out)
    }
}

fn table(out: &mut String, t: &Table) {
    let _ = write!(
        out,
        "<table class=\"ferry-table\" data-title=\"{0}\"><caption>{0}</caption><thead><tr>",
        escape(&t.title)
    );
    for c in &t.columns {
        let _ = write!(out, "<th>{}</th>", escape(c));
    }
    out.push_str("</tr></thead><tbody>\n");
    for row in &t.rows {
        out.push_str("<tr>");
        for cell in row {
            if names_a_file_beside(cell) {
                let _ = write!(out, "<td><a href=\"{0}\">{0}</a></td>", escape(cell));
            } else {
                let _ = write!(out, "<td>{}</td>", escape(cell));
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n");
    for n in &t.notes {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", escape(n));
    }
}

/// Whether a table's cell is the name of a file beside the page (a run's
/// timeline SVG, its summary JSON), which the page then links.
fn names_a_file_beside(cell: &str) -> bool {
    !cell.contains(|c: char| c.is_whitespace() || c == '/' || c == '\\')
        && !cell.starts_with('.')
        && [".svg", ".json", ".html"]
            .iter()
            .any(|ext| cell.len() > ext.len() && cell.ends_with(ext))
}

/// An SVG document's body, without an XML prolog (not allowed inline).
fn strip_prolog(svg: &str) -> &str {
    match svg.find("<svg") {
        Some(i) => &svg[i..],
        None => svg,
    }
}

/// `s` with HTML's special characters escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::{Bar, Bars};

    #[test]
    fn a_page_holds_its_tables_and_each_charts_marks() {
        let mut t = Table::new("A <demo>", &["cell", "s", "timeline"]);
        t.row(vec!["1".into(), "4.34".into(), "run-cell1.svg".into()]);
        t.row(vec!["2".into(), "5.00".into(), "not run.svg".into()]);
        let bars = Bars {
            title: "t".into(),
            y_label: "s".into(),
            categories: vec!["cell 1".into(), "cell 2".into()],
            groups: vec!["auto".into(), "quota".into()],
            values: vec![
                vec![Bar::Value(3.0), Bar::NoValue("did not converge".into())],
                vec![Bar::Value(1.0), Bar::Value(2.0)],
            ],
            references: vec![],
            reference_label: String::new(),
        };
        let page = Page {
            title: "run",
            intro: &[],
            tables: &[t],
            charts: &[bars.into()],
            json: Some("run.json"),
            others: &["zap.html".into()],
        }
        .render()
        .unwrap();
        assert!(page.contains("<a href=\"zap.html\">zap.html</a>"), "{page}");
        assert!(page.contains("<td>4.34</td>"), "{page}");
        assert!(
            page.contains("<td><a href=\"run-cell1.svg\">run-cell1.svg</a></td>"),
            "a file beside the page is linked: {page}"
        );
        assert!(page.contains("<td>not run.svg</td>"), "{page}");
        assert!(page.contains("A &lt;demo&gt;"), "{page}");
        assert!(page.contains("data-marks=\"4\""), "{page}");
        assert_eq!(crate::chart::marks::count(&page, "mark"), 3);
        assert_eq!(crate::chart::marks::count(&page, "mark no-value"), 1);
        assert!(page.contains("did not converge"));
        assert!(page.contains("cell 2"), "the axis names the cells");
        assert!(!page.contains("<script"), "no script");
    }
}
