//! Which SVG elements are data: plotters' SVG backend writes no classes,
//! so every data mark is drawn at a sentinel opacity, and [`tag`] gives
//! each element drawn at one its class. A reader of the page (a person's
//! stylesheet, the browser test) can then count and pick the marks:
//!
//! ```text
//!   class="mark"            one value (a bar, a point)
//!   class="mark no-value"   a run that has no value, labelled with why
//!                           ("did not converge"): never drawn as a number
//!   class="reference"       a published figure to compare with (a seed's)
//!   class="band"            a span of time (the pause, postcopy)
//! ```

use plotters::style::{RGBAColor, RGBColor};

/// The opacities that mark each kind (distinct from everything else
/// drawn: text, axes and legends are opaque, grid lines much fainter).
const VALUE: f64 = 0.9;
const NO_VALUE: f64 = 0.91;
const REFERENCE: f64 = 0.92;
const BAND: f64 = 0.22;

/// `color` as a data mark.
pub(crate) fn value(color: RGBColor) -> RGBAColor {
    RGBAColor(color.0, color.1, color.2, VALUE)
}

/// `color` as a run with no value.
pub(crate) fn no_value(color: RGBColor) -> RGBAColor {
    RGBAColor(color.0, color.1, color.2, NO_VALUE)
}

/// `color` as a reference figure.
pub(crate) fn reference(color: RGBColor) -> RGBAColor {
    RGBAColor(color.0, color.1, color.2, REFERENCE)
}

/// `color` as a band of time.
pub(crate) fn band(color: RGBColor) -> RGBAColor {
    RGBAColor(color.0, color.1, color.2, BAND)
}

/// Gives every element drawn at a sentinel opacity its class.
pub(crate) fn tag(svg: &str) -> String {
    let mut out = svg.to_owned();
    for (opacity, class) in [
        (VALUE, "mark"),
        (NO_VALUE, "mark no-value"),
        (REFERENCE, "reference"),
        (BAND, "band"),
    ] {
        let attr = format!("opacity=\"{opacity}\"");
        out = out.replace(&attr, &format!("{attr} class=\"{class}\""));
    }
    out
}

/// How many elements of `svg` carry `class` exactly.
pub fn count(svg: &str, class: &str) -> usize {
    svg.matches(&format!("class=\"{class}\"")).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sentinels_are_tagged() {
        let svg = r#"<rect opacity="0.9"/><rect opacity="0.91"/><rect opacity="1"/><path opacity="0.92"/>"#;
        let tagged = tag(svg);
        assert_eq!(count(&tagged, "mark"), 1, "{tagged}");
        assert_eq!(count(&tagged, "mark no-value"), 1, "{tagged}");
        assert_eq!(count(&tagged, "reference"), 1, "{tagged}");
    }
}
