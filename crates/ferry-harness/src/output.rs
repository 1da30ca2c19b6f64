//! The JSON a command reports: ferry's and minivmm's commands end their
//! output with a summary as one JSON line (`--json`), after whatever they
//! printed for a reader.

use serde_json::Value;

/// The last line of `text` that is JSON: what a child reported last,
/// whatever it printed around it.
pub fn last_json(text: &str) -> Option<Value> {
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
}

/// The last line of `text`, which must be JSON: a command's `--json`
/// summary is the last thing it prints, and a test holds it to that.
pub fn last_line_json(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str(text.lines().last().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_json_line_wins_and_the_last_line_must_be_json() {
        let text = "starting\n{\"a\":1}\nprogress\n{\"a\":2}\n";
        assert_eq!(last_json(text).unwrap()["a"], 2);
        assert_eq!(last_line_json(text).unwrap()["a"], 2);
        let trailing = "{\"a\":1}\ndone\n";
        assert_eq!(last_json(trailing).unwrap()["a"], 1);
        assert!(last_line_json(trailing).is_err());
        assert!(last_json("no json here").is_none());
        assert!(last_line_json("").is_err());
    }
}
