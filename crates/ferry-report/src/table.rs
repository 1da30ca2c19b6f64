//! The seed-shaped text table every experiment prints.

use serde::Serialize;
use std::fmt::Write as _;

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
