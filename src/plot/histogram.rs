//! A logarithmic histogram ([`super::bins::LogHistogram`]) drawn as bars over decades, with
//! an optional bound (a tolerance) as a vertical line: bars wholly below it blue, wholly
//! above it red, the one that straddles it orange, so a near-miss shows where it lies.

use plotters::coord::combinators::LogCoord;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::{
    BitMapBackend, Cartesian2d, ChartBuilder, ChartContext, IntoFont, IntoLogRange, PathElement,
    Rectangle, Text,
};
use plotters::style::{Color, FontStyle, RGBColor, ShapeStyle, BLACK};

use super::bins::LogHistogram;
use super::{drawing_error, Area, Image, FONT};
use crate::error::Result;

/// Width of a histogram picture in pixels.
pub const WIDTH: u32 = 860;
/// Height of a histogram picture in pixels.
pub const HEIGHT: u32 = 540;

const BELOW: RGBColor = RGBColor(0x43, 0x93, 0xc3);
const STRADDLING: RGBColor = RGBColor(0xf4, 0xa5, 0x42);
const ABOVE: RGBColor = RGBColor(0xb2, 0x18, 0x2b);

/// A histogram picture.
#[derive(Clone, Debug)]
pub struct HistogramPlot<'a> {
    /// The first line, in bold.
    pub title: String,
    /// Lines under the title.
    pub lines: Vec<String>,
    /// The counts.
    pub histogram: &'a LogHistogram,
    /// The bound to mark (same units as the values), if any.
    pub bound: Option<f64>,
    /// The caption of the horizontal axis.
    pub x_label: String,
}

/// `10^k` with a superscript exponent: `10⁻⁷`.
pub fn power_of_ten(k: i64) -> String {
    const DIGITS: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    let mut s = String::from("10");
    if k < 0 {
        s.push('⁻');
    }
    for d in k.unsigned_abs().to_string().bytes() {
        s.push(DIGITS[usize::from(d - b'0')]);
    }
    s
}

impl HistogramPlot<'_> {
    /// Draws the picture ([`WIDTH`] × [`HEIGHT`]).
    pub fn render(&self) -> Result<Image> {
        let h = self.histogram;
        let (lo, hi) = self.x_range();
        let top_count = h.counts.iter().copied().max().unwrap_or(0).max(1) as f64;
        let y_top = top_count * 3.0;
        let header = 30 + 20 * self.lines.len() as i32 + 8;
        Image::draw(WIDTH, HEIGHT, |area| {
            self.draw_header(area)?;
            let (_, lower) = area.split_vertically(16 + header);
            let mut chart = ChartBuilder::on(&lower)
                .margin(16)
                .x_label_area_size(44)
                .y_label_area_size(64)
                .build_cartesian_2d(lo..hi, (0.8f64..y_top).log_scale())
                .map_err(drawing_error)?;
            self.draw_mesh(&mut chart, (hi - lo) as usize)?;
            chart.draw_series(self.bars()).map_err(drawing_error)?;
            if let Some(b) = self.bound.filter(|b| *b > 0.0 && b.is_finite()) {
                draw_bound(&mut chart, b, y_top)?;
            }
            Ok(())
        })
    }

    /// The horizontal axis, log10 of the value: whole decades around the counts and the
    /// bound (decades −8 to 0 for no counts).
    fn x_range(&self) -> (f64, f64) {
        let h = self.histogram;
        let p = f64::from(h.per_decade);
        let (mut lo, mut hi) = if h.counts.is_empty() {
            (-8.0, 0.0)
        } else {
            (
                f64::from(h.first) / p,
                f64::from(h.first + h.counts.len() as i32) / p,
            )
        };
        if let Some(b) = self.bound.filter(|b| *b > 0.0 && b.is_finite()) {
            lo = lo.min(b.log10().floor() - 0.5);
            hi = hi.max(b.log10().ceil() + 0.5);
        }
        lo = lo.floor();
        hi = hi.ceil().max(lo + 1.0);
        (lo, hi)
    }

    /// The title, in bold, and the lines under it.
    fn draw_header(&self, area: &Area<'_>) -> Result<()> {
        let title = (FONT, 20).into_font().style(FontStyle::Bold);
        area.draw(&Text::new(self.title.clone(), (16, 16), title))
            .map_err(drawing_error)?;
        for (k, line) in self.lines.iter().enumerate() {
            let y = 46 + 20 * k as i32;
            area.draw(&Text::new(line.clone(), (16, y), (FONT, 14).into_font()))
                .map_err(drawing_error)?;
        }
        Ok(())
    }

    /// The axes over `decades` decades: powers of ten along, element counts up.
    fn draw_mesh(&self, chart: &mut Chart<'_, '_>, decades: usize) -> Result<()> {
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_max_light_lines(0)
            .x_labels(decades.min(16) + 1)
            .x_label_formatter(&|v| {
                if (v - v.round()).abs() < 1e-9 {
                    power_of_ten(v.round() as i64)
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| format!("{}", v.round()))
            .x_desc(self.x_label.clone())
            .y_desc("elements")
            .label_style((FONT, 12))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(drawing_error)
    }

    /// A bar per non-empty bin, coloured by where it lies against the bound.
    fn bars(&self) -> impl Iterator<Item = Rectangle<(f64, f64)>> + '_ {
        let h = self.histogram;
        let p = f64::from(h.per_decade);
        let bound = self.bound;
        h.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(move |(i, &c)| {
                let (e0, e1) = h.bin_edges(i);
                let colour = match bound {
                    Some(b) if e0 > b => ABOVE,
                    Some(b) if e1 > b => STRADDLING,
                    _ => BELOW,
                };
                let x0 = f64::from(h.first + i as i32) / p;
                Rectangle::new([(x0, 0.8), (x0 + 1.0 / p, c as f64)], colour.filled())
            })
    }
}

/// The chart of a histogram: log10 of the value along, a log scale of counts up.
type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, LogCoord<f64>>>;

/// The bound `b` as a vertical line up to `y_top`, labelled.
fn draw_bound(chart: &mut Chart<'_, '_>, b: f64, y_top: f64) -> Result<()> {
    let x = b.log10();
    let style = ShapeStyle::from(&BLACK).stroke_width(2);
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(x, 0.8), (x, y_top)],
            style,
        )))
        .map_err(drawing_error)?;
    let label = (FONT, 12).into_font().color(&BLACK);
    chart
        .draw_series(std::iter::once(Text::new(
            format!(" bound {b:.1e}"),
            (x, y_top / 1.6),
            label,
        )))
        .map_err(drawing_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_ten_use_superscripts() {
        assert_eq!(power_of_ten(-7), "10⁻⁷");
        assert_eq!(power_of_ten(0), "10⁰");
        assert_eq!(power_of_ten(12), "10¹²");
    }

    #[test]
    fn bars_below_and_above_the_bound_differ_in_colour() {
        let values: Vec<f64> = [1e-8, 2e-8, 3e-7, 5e-3].to_vec();
        let h = LogHistogram::of(&values, 4);
        let plot = HistogramPlot {
            title: "t".into(),
            lines: vec![],
            histogram: &h,
            bound: Some(1e-4),
            x_label: "x".into(),
        };
        let image = plot.render().unwrap();
        assert_eq!((image.width, image.height), (WIDTH, HEIGHT));
        let has = |c: RGBColor| image.rgb.chunks(3).any(|p| p == [c.0, c.1, c.2]);
        assert!(has(BELOW) && has(ABOVE) && !has(STRADDLING));
        // All zeros: no bars, still a picture.
        let zeros = LogHistogram::of(&[0.0; 4], 4);
        let plot = HistogramPlot {
            histogram: &zeros,
            bound: None,
            ..plot
        };
        let image = plot.render().unwrap();
        assert!(!image
            .rgb
            .chunks(3)
            .any(|p| p == [BELOW.0, BELOW.1, BELOW.2]));
    }
}
