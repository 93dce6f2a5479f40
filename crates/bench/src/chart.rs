//! Charts as SVG or PNG, chosen by the file's extension. Every chart is drawn once, by a
//! function generic over the plotters backend; [`render_chart!`] hands it the drawing area
//! of the right one. Text is laid out (and, in PNG, drawn) with a TrueType font from the
//! system: DejaVu Sans or Liberation Sans (Debian: fonts-dejavu-core, which
//! scripts/install-deps.sh installs), or the file named by `STRIPELOG_CHART_FONT`.

use std::path::Path;
use std::sync::OnceLock;

/// Where Debian, Fedora, Arch and macOS keep a sans-serif TrueType font.
const FONT_PATHS: [&str; 6] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial Unicode.ttf",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

/// The chart format of `path`, from its extension.
pub fn format_of(path: &Path) -> Result<Format, String> {
    match path.extension().and_then(|extension| extension.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        _ => Err(format!("{}: a chart is written as .svg or .png", path.display())),
    }
}

/// Refuse, before a long run, a chart path that could not be written: the extension and
/// the font.
pub fn check(path: &Path) -> Result<(), String> {
    format_of(path)?;
    register_font()
}

/// Make "sans-serif" available to plotters, once per process.
pub fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let configured = std::env::var_os("STRIPELOG_CHART_FONT").map(std::path::PathBuf::from);
            let candidates = configured.into_iter().chain(FONT_PATHS.iter().map(std::path::PathBuf::from));
            for path in candidates {
                if let Ok(bytes) = std::fs::read(&path) {
                    // The font lives as long as the process: plotters keeps a 'static reference.
                    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                    return plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
                        .map_err(|_| format!("{}: not a usable TrueType font", path.display()));
                }
            }
            Err("charts need a TrueType font: install fonts-dejavu-core, or name one with STRIPELOG_CHART_FONT".into())
        })
        .clone()
}

/// Draw a chart into `path` (SVG or PNG by extension) of `size` pixels:
/// `render_chart!(path, (900, 500), |root| draw(&root, report))`, where `draw` is generic
/// over `DB: DrawingBackend` and returns `Result<(), String>`.
#[macro_export]
macro_rules! render_chart {
    ($path:expr, $size:expr, |$root:ident| $draw:expr) => {{
        use plotters::prelude::IntoDrawingArea;
        let path: &std::path::Path = $path;
        $crate::chart::register_font()?;
        match $crate::chart::format_of(path)? {
            $crate::chart::Format::Svg => {
                let $root = plotters::prelude::SVGBackend::new(path, $size).into_drawing_area();
                $draw?;
                $root.present().map_err(|error| format!("{}: {error}", path.display()))
            }
            $crate::chart::Format::Png => {
                let $root = plotters::prelude::BitMapBackend::new(path, $size).into_drawing_area();
                $draw?;
                $root.present().map_err(|error| format!("{}: {error}", path.display()))
            }
        }
    }};
}

/// An axis tick as a person writes it: no spurious decimals ("100000.0" is "100 k", "1.0"
/// is "1", "0.010" is "0.01"), thousands and millions shortened.
pub fn tick(value: &f64) -> String {
    fn trimmed(text: String) -> String {
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    }
    let magnitude = value.abs();
    if magnitude >= 1e9 {
        format!("{} G", trimmed(format!("{:.2}", value / 1e9)))
    } else if magnitude >= 1e6 {
        format!("{} M", trimmed(format!("{:.2}", value / 1e6)))
    } else if magnitude >= 1e4 {
        format!("{} k", trimmed(format!("{:.1}", value / 1e3)))
    } else if magnitude >= 1.0 || *value == 0.0 {
        trimmed(format!("{value:.1}"))
    } else {
        // Enough decimals for the first two significant digits.
        let decimals = (-magnitude.log10().floor()) as usize + 1;
        trimmed(format!("{value:.decimals$}"))
    }
}

/// Draw a chart's mesh with its two axis descriptions, every tick written by [`tick`].
pub fn draw_axes<DB, X, Y>(
    chart: &mut plotters::chart::ChartContext<'_, DB, plotters::coord::cartesian::Cartesian2d<X, Y>>,
    x_description: &str,
    y_description: &str,
) -> Result<(), String>
where
    DB: plotters::prelude::DrawingBackend,
    X: plotters::coord::ranged1d::Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_description)
        .y_desc(y_description)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()
        .map_err(failed)
}

/// The top share of a chart's plot area kept free of data, where its legend is drawn
/// (upper right): the legend never covers a curve.
pub const LEGEND_BAND_FRACTION: f64 = 0.25;

/// The top of a linear axis from 0 whose highest value is `peak`: the data stay below
/// the legend's band.
pub fn linear_top(peak: f64) -> f64 {
    peak.max(1e-9) / (1.0 - LEGEND_BAND_FRACTION)
}

/// The top of a logarithmic axis from `lowest` whose highest value is `highest`: the data
/// stay below the legend's band.
pub fn log_top(lowest: f64, highest: f64) -> f64 {
    let span = (highest / lowest).max(1.0).ln();
    lowest * (span / (1.0 - LEGEND_BAND_FRACTION)).exp()
}

/// Draw a chart's legend in the band [`linear_top`] and [`log_top`] keep free.
pub fn draw_legend<'a, DB, X, Y>(
    chart: &mut plotters::chart::ChartContext<'a, DB, plotters::coord::cartesian::Cartesian2d<X, Y>>,
) -> Result<(), String>
where
    DB: plotters::prelude::DrawingBackend + 'a,
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    use plotters::prelude::*;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(failed)
}

/// A plotters error as text, for charts' `Result<(), String>`.
pub fn failed<E: std::fmt::Debug>(error: E) -> String {
    format!("drawing a chart: {error:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_chooses_the_format() {
        assert_eq!(format_of(Path::new("a/b.svg")), Ok(Format::Svg));
        assert_eq!(format_of(Path::new("b.PNG")), Ok(Format::Png));
        assert!(format_of(Path::new("b.jpg")).is_err());
        assert!(format_of(Path::new("b")).is_err());
    }

    #[test]
    fn the_data_stay_below_the_legend_band() {
        // Linear from 0: the peak at 1 − band of the height.
        let top = linear_top(1000.0);
        assert!((1000.0 / top - (1.0 - LEGEND_BAND_FRACTION)).abs() < 1e-12);
        // Logarithmic: the highest value at 1 − band of the (log) height.
        let (lowest, highest) = (0.01, 50.0);
        let top = log_top(lowest, highest);
        let height = |value: f64| (value / lowest).ln() / (top / lowest).ln();
        assert!((height(highest) - (1.0 - LEGEND_BAND_FRACTION)).abs() < 1e-12);
    }

    #[test]
    fn ticks_have_no_spurious_decimals() {
        let cases = [
            (100_000.0, "100 k"),
            (1.0, "1"),
            (2.5, "2.5"),
            (0.01, "0.01"),
            (0.00025, "0.00025"),
            (0.0, "0"),
            (1_500_000.0, "1.5 M"),
            (25_000.0, "25 k"),
            (5_000.0, "5000"),
            (2.5e9, "2.5 G"),
        ];
        for (value, expected) in cases {
            assert_eq!(tick(&value), expected, "{value}");
        }
    }
}
