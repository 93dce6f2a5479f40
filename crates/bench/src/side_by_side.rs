//! Tables with one column per run and one row per figure (`compare`, `slow-member`).

use std::fmt::Write;

/// Append to `text` a header line of column `names`, then one line per row: its label
/// (padded to `label_width`) and its cells, right-aligned under the names.
pub(crate) fn append(text: &mut String, label_width: usize, names: &[&str], rows: &[(&str, Vec<String>)]) {
    let width = names.iter().map(|name| name.len()).max().unwrap_or(10).max(12);
    let _ = write!(text, "{:<label_width$}", "");
    for name in names {
        let _ = write!(text, " {name:>width$}");
    }
    text.push('\n');
    for (label, cells) in rows {
        let _ = write!(text, "{label:<label_width$}");
        for cell in cells {
            let _ = write!(text, " {cell:>width$}");
        }
        text.push('\n');
    }
}
