//! Sheets of matrices drawn as heat maps: one panel per matrix in a grid, each cell
//! coloured on the diverging scale of [`super::colormap`], a colour bar, and cells a model
//! never reads in grey.
//!
//! A matrix of at most `panel_px` rows and columns is drawn with square cells of a whole
//! number of pixels; a larger one is reduced by an integer factor k, each pixel the mean of
//! the read cells of its k×k block ([`raster`]).

use plotters::element::BitMapElement;
use plotters::prelude::{IntoFont, Rectangle, Text};
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{Color, FontStyle, RGBColor, BLACK};

use super::colormap::{diverging, symmetric_limit, MASKED, NOT_FINITE};
use super::{drawing_error, signed, Area, Image, FONT};
use crate::error::Result;

/// One matrix to draw.
#[derive(Clone, Debug)]
pub struct Matrix {
    /// Text above the panel.
    pub label: String,
    /// Rows (drawn top to bottom).
    pub rows: usize,
    /// Columns (drawn left to right).
    pub cols: usize,
    /// Row-major values, `rows · cols` of them.
    pub values: Vec<f32>,
    /// Row-major: false for the cells the model never reads; `None` when every cell is read.
    pub read: Option<Vec<bool>>,
}

impl Matrix {
    fn is_read(&self, i: usize) -> bool {
        i < self.values.len() && self.read.as_ref().is_none_or(|r| r.get(i) == Some(&true))
    }

    /// The largest finite magnitude over the read cells.
    pub fn limit(&self) -> f64 {
        symmetric_limit(
            (0..self.values.len())
                .filter(|&i| self.is_read(i))
                .map(|i| f64::from(self.values[i])),
        )
    }
}

/// How panels share the colour scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// One scale for every panel: ±(the largest magnitude of all of them).
    Shared,
    /// Each panel on ±(its own largest magnitude); the colour bar reads in those units.
    PerPanel,
}

/// A picture of several matrices.
#[derive(Clone, Debug)]
pub struct Sheet {
    /// The first line, in bold.
    pub title: String,
    /// Lines under the title.
    pub lines: Vec<String>,
    /// The matrices, row by row of the grid.
    pub panels: Vec<Matrix>,
    /// Panels per row of the grid.
    pub columns: usize,
    /// Largest side of a panel's picture in pixels.
    pub panel_px: u32,
    /// How the panels share the colour scale.
    pub scale: Scale,
    /// The caption of the colour bar.
    pub bar_label: String,
}

/// A pixel of a panel: the (mean) value of its cells, or no read cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pixel {
    /// The value (mean of the read cells it covers).
    Value(f64),
    /// It covers no cell the model reads.
    Masked,
}

/// A panel's pixels, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Raster {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Pixels per cell side (1 when reduced).
    pub cell_px: u32,
    /// Row-major pixels.
    pub pixels: Vec<Pixel>,
}

/// The pixels of `m` in at most `max_px` × `max_px` (see the module doc).
pub fn raster(m: &Matrix, max_px: u32) -> Raster {
    let (rows, cols) = (m.rows.max(1), m.cols.max(1));
    let big = rows.max(cols);
    let max_px = (max_px as usize).max(1);
    if big <= max_px {
        let s = max_px / big;
        let (w, h) = (cols * s, rows * s);
        let mut pixels = Vec::with_capacity(w * h);
        for py in 0..h {
            for px in 0..w {
                let i = (py / s) * m.cols + px / s;
                pixels.push(if m.is_read(i) {
                    Pixel::Value(f64::from(m.values[i]))
                } else {
                    Pixel::Masked
                });
            }
        }
        return Raster {
            width: w as u32,
            height: h as u32,
            cell_px: s as u32,
            pixels,
        };
    }
    let k = big.div_ceil(max_px);
    let (w, h) = (cols.div_ceil(k), rows.div_ceil(k));
    let mut sums = vec![0f64; w * h];
    let mut counts = vec![0u32; w * h];
    for i in 0..m.rows {
        for j in 0..m.cols {
            let c = i * m.cols + j;
            if m.is_read(c) {
                let p = (i / k) * w + j / k;
                sums[p] += f64::from(m.values[c]);
                counts[p] += 1;
            }
        }
    }
    let pixels = sums
        .iter()
        .zip(&counts)
        .map(|(&s, &c)| {
            if c == 0 {
                Pixel::Masked
            } else {
                Pixel::Value(s / f64::from(c))
            }
        })
        .collect();
    Raster {
        width: w as u32,
        height: h as u32,
        cell_px: 1,
        pixels,
    }
}

// Layout, in pixels.
const MARGIN: i32 = 16;
const TITLE: i32 = 30;
const LINE: i32 = 20;
const LABEL: i32 = 22;
const Y_TICKS: i32 = 40;
const X_TICKS: i32 = 20;
const GAP: i32 = 16;
const BAR: i32 = 16;
const BAR_BAND: i32 = 120;
const LEGEND: i32 = 26;

fn text_width(text: &str, size: f64, style: FontStyle) -> i32 {
    (FONT, size)
        .into_font()
        .style(style)
        .box_size(text)
        .map_or(text.chars().count() as i32 * size as i32, |(w, _)| w as i32)
}

impl Sheet {
    /// Draws the sheet.
    pub fn render(&self) -> Result<Image> {
        super::register_fonts()?;
        let rasters: Vec<Raster> = self
            .panels
            .iter()
            .map(|m| raster(m, self.panel_px))
            .collect();
        let limits = self.limits();
        let l = self.layout(&rasters);
        let masked = rasters.iter().any(|r| r.pixels.contains(&Pixel::Masked));
        let not_finite = rasters.iter().any(|r| {
            r.pixels
                .iter()
                .any(|p| matches!(p, Pixel::Value(v) if !v.is_finite()))
        });
        Image::draw(l.width as u32, l.height as u32, |area| {
            self.draw_header(area)?;
            for (p, (m, r)) in self.panels.iter().zip(&rasters).enumerate() {
                let (gr, gc) = ((p / l.columns) as i32, (p % l.columns) as i32);
                let x0 = MARGIN + gc * (Y_TICKS + l.slot_w + GAP) + Y_TICKS;
                let y0 = l.top + gr * (l.row_h + GAP) + LABEL;
                draw_panel(area, m, r, limits[p], (x0, y0))?;
            }
            let bar_x = MARGIN + l.grid_w + 24;
            draw_bar(
                area,
                (bar_x, l.top + LABEL),
                l.bar_h,
                limits_for_bar(self, &limits),
                &self.bar_label,
            )?;
            let legend_y = l.height - MARGIN - LEGEND + 8;
            draw_legend(area, legend_y, masked, not_finite)
        })
    }

    /// Each panel's colour limit: its own, or the largest of all on a shared scale.
    fn limits(&self) -> Vec<f64> {
        match self.scale {
            Scale::PerPanel => self.panels.iter().map(Matrix::limit).collect(),
            Scale::Shared => {
                let all = self.panels.iter().map(Matrix::limit).fold(0f64, f64::max);
                vec![all; self.panels.len()]
            }
        }
    }

    /// Where the parts of the sheet go, for panels drawn as `rasters`.
    fn layout(&self, rasters: &[Raster]) -> Layout {
        let columns = self.columns.clamp(1, self.panels.len().max(1));
        let grid_rows = self.panels.len().div_ceil(columns).max(1);
        let label_w = self
            .panels
            .iter()
            .map(|m| text_width(&m.label, 14.0, FontStyle::Normal))
            .max()
            .unwrap_or(0);
        let slot_w = rasters
            .iter()
            .map(|r| r.width as i32)
            .max()
            .unwrap_or(0)
            .max(label_w);
        let slot_h = rasters.iter().map(|r| r.height as i32).max().unwrap_or(0);
        let top = MARGIN + TITLE + self.lines.len() as i32 * LINE + 6;
        let row_h = LABEL + slot_h + X_TICKS;
        let bar_h = slot_h.clamp(120, 400);
        let grid_w = columns as i32 * (Y_TICKS + slot_w) + (columns as i32 - 1) * GAP;
        let text_w = std::iter::once(text_width(&self.title, 20.0, FontStyle::Bold))
            .chain(
                self.lines
                    .iter()
                    .map(|l| text_width(l, 14.0, FontStyle::Normal)),
            )
            .max()
            .unwrap_or(0);
        let width = (MARGIN + grid_w + BAR_BAND + MARGIN).max(2 * MARGIN + text_w);
        let grid_h = grid_rows as i32 * row_h + (grid_rows as i32 - 1) * GAP;
        let height = top + grid_h.max(LABEL + bar_h + X_TICKS) + LEGEND + MARGIN;
        Layout {
            columns,
            slot_w,
            top,
            row_h,
            bar_h,
            grid_w,
            width,
            height,
        }
    }

    /// The title, in bold, and the lines under it.
    fn draw_header(&self, area: &Area<'_>) -> Result<()> {
        let title = (FONT, 20).into_font().style(FontStyle::Bold);
        area.draw(&Text::new(self.title.clone(), (MARGIN, MARGIN), title))
            .map_err(drawing_error)?;
        for (k, line) in self.lines.iter().enumerate() {
            let y = MARGIN + TITLE + k as i32 * LINE;
            area.draw(&Text::new(
                line.clone(),
                (MARGIN, y),
                (FONT, 14).into_font(),
            ))
            .map_err(drawing_error)?;
        }
        Ok(())
    }
}

/// Where the parts of a sheet go, in pixels.
struct Layout {
    /// Panels per grid row.
    columns: usize,
    /// Width of a panel's slot (its raster or its label, the wider).
    slot_w: i32,
    /// Top of the grid.
    top: i32,
    /// Height of a grid row: label, raster, ticks.
    row_h: i32,
    /// Height of the colour bar.
    bar_h: i32,
    /// Width of the grid.
    grid_w: i32,
    /// Width of the picture.
    width: i32,
    /// Height of the picture.
    height: i32,
}

/// The legend at `legend_y`: a swatch for cells never read (if any are `masked`) and one
/// for values `not_finite` (if any).
fn draw_legend(area: &Area<'_>, legend_y: i32, masked: bool, not_finite: bool) -> Result<()> {
    let mut legend_x = MARGIN;
    for (show, colour, text) in [
        (
            masked,
            MASKED,
            "never read by the model (causal mask, window, fold)",
        ),
        (not_finite, NOT_FINITE, "not finite (NaN or infinite)"),
    ] {
        if show {
            legend_x = draw_swatch(area, (legend_x, legend_y), colour, text)? + 24;
        }
    }
    Ok(())
}

/// The bar's end value: the shared limit, or 1 (units of each panel's own limit).
fn limits_for_bar(sheet: &Sheet, limits: &[f64]) -> f64 {
    match sheet.scale {
        Scale::Shared => limits.first().copied().unwrap_or(0.0),
        Scale::PerPanel => 1.0,
    }
}

fn rgb(c: [u8; 3]) -> RGBColor {
    RGBColor(c[0], c[1], c[2])
}

fn draw_panel(
    area: &Area<'_>,
    m: &Matrix,
    r: &Raster,
    limit: f64,
    (x0, y0): (i32, i32),
) -> Result<()> {
    let label = (FONT, 14).into_font();
    area.draw(&Text::new(m.label.clone(), (x0, y0 - LABEL + 3), label))
        .map_err(drawing_error)?;
    let mut buf = Vec::with_capacity(r.pixels.len() * 3);
    for p in &r.pixels {
        buf.extend_from_slice(&match *p {
            Pixel::Value(v) => diverging(v, limit),
            Pixel::Masked => MASKED,
        });
    }
    if let Some(image) = BitMapElement::with_owned_buffer((x0, y0), (r.width, r.height), buf) {
        area.draw(&image).map_err(drawing_error)?;
    }
    let (w, h) = (r.width as i32, r.height as i32);
    let frame = RGBColor(96, 96, 96);
    area.draw(&Rectangle::new([(x0 - 1, y0 - 1), (x0 + w, y0 + h)], frame))
        .map_err(drawing_error)?;
    // Index ticks: first and last row and column.
    let ticks = (FONT, 12).into_font().color(&BLACK);
    let last_row = m.rows.saturating_sub(1);
    let last_col = m.cols.saturating_sub(1);
    let cell = r.cell_px as i32;
    let at = |h: HPos, v: VPos| ticks.pos(Pos::new(h, v));
    area.draw(&Text::new(
        "0".to_string(),
        (x0 - 4, y0),
        at(HPos::Right, VPos::Top),
    ))
    .map_err(drawing_error)?;
    area.draw(&Text::new(
        last_row.to_string(),
        (x0 - 4, y0 + h - cell.min(12)),
        at(HPos::Right, VPos::Top),
    ))
    .map_err(drawing_error)?;
    area.draw(&Text::new(
        "0".to_string(),
        (x0, y0 + h + 3),
        at(HPos::Left, VPos::Top),
    ))
    .map_err(drawing_error)?;
    area.draw(&Text::new(
        last_col.to_string(),
        (x0 + w, y0 + h + 3),
        at(HPos::Right, VPos::Top),
    ))
    .map_err(drawing_error)?;
    Ok(())
}

fn draw_bar(area: &Area<'_>, (x, y): (i32, i32), h: i32, limit: f64, caption: &str) -> Result<()> {
    let mut buf = Vec::with_capacity((BAR * h * 3) as usize);
    for row in 0..h {
        // Top: +1, bottom: −1.
        let t = 1.0 - 2.0 * f64::from(row) / f64::from((h - 1).max(1));
        let c = diverging(t, 1.0);
        for _ in 0..BAR {
            buf.extend_from_slice(&c);
        }
    }
    if let Some(image) = BitMapElement::with_owned_buffer((x, y), (BAR as u32, h as u32), buf) {
        area.draw(&image).map_err(drawing_error)?;
    }
    area.draw(&Rectangle::new(
        [(x - 1, y - 1), (x + BAR, y + h)],
        RGBColor(96, 96, 96),
    ))
    .map_err(drawing_error)?;
    let caption_style = (FONT, 14).into_font();
    area.draw(&Text::new(
        caption.to_string(),
        (x - 8, y - LABEL + 3),
        caption_style,
    ))
    .map_err(drawing_error)?;
    let ticks = (FONT, 12)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for k in 0..=4 {
        let t = 1.0 - f64::from(k) / 2.0;
        let ty = y + (f64::from(h - 1) * f64::from(k) / 4.0).round() as i32;
        area.draw(&Rectangle::new(
            [(x + BAR, ty), (x + BAR + 4, ty + 1)],
            BLACK.filled(),
        ))
        .map_err(drawing_error)?;
        area.draw(&Text::new(
            signed(t * limit),
            (x + BAR + 7, ty),
            ticks.clone(),
        ))
        .map_err(drawing_error)?;
    }
    Ok(())
}

/// A swatch and its caption at `(x, y)`; returns the x where the caption ends.
fn draw_swatch(area: &Area<'_>, (x, y): (i32, i32), colour: [u8; 3], text: &str) -> Result<i32> {
    area.draw(&Rectangle::new(
        [(x, y), (x + 14, y + 14)],
        rgb(colour).filled(),
    ))
    .map_err(drawing_error)?;
    area.draw(&Rectangle::new(
        [(x, y), (x + 14, y + 14)],
        RGBColor(96, 96, 96),
    ))
    .map_err(drawing_error)?;
    area.draw(&Text::new(
        text.to_string(),
        (x + 20, y),
        (FONT, 14).into_font(),
    ))
    .map_err(drawing_error)?;
    Ok(x + 20 + text_width(text, 14.0, FontStyle::Normal))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: usize, cols: usize, read: Option<Vec<bool>>) -> Matrix {
        Matrix {
            label: String::new(),
            rows,
            cols,
            values: (0..rows * cols).map(|v| v as f32).collect(),
            read,
        }
    }

    #[test]
    fn small_matrices_get_whole_pixel_cells() {
        let r = raster(&matrix(2, 4, None), 10);
        assert_eq!((r.width, r.height, r.cell_px), (8, 4, 2));
        // Pixel (row 3, column 5) is cell (1, 2) = 6.
        assert_eq!(r.pixels[3 * 8 + 5], Pixel::Value(6.0));
        let masked = raster(&matrix(1, 2, Some(vec![true, false])), 2);
        assert_eq!(masked.pixels, vec![Pixel::Value(0.0), Pixel::Masked]);
    }

    #[test]
    fn large_matrices_are_reduced_to_block_means_of_read_cells() {
        // 5×5 into at most 2 pixels: blocks of 3×3 cells, the last ones partial.
        let mut read = vec![true; 25];
        read[0] = false; // cell (0, 0) left out of the first block's mean
        let r = raster(&matrix(5, 5, Some(read)), 2);
        assert_eq!((r.width, r.height, r.cell_px), (2, 2, 1));
        let first = [1.0, 2.0, 5.0, 6.0, 7.0, 10.0, 11.0, 12.0];
        let mean = first.iter().sum::<f64>() / 8.0;
        assert_eq!(r.pixels[0], Pixel::Value(mean));
        // Bottom-right: cells (3..5, 3..5) = 18, 19, 23, 24.
        assert_eq!(r.pixels[3], Pixel::Value(21.0));
        let none = raster(&matrix(4, 4, Some(vec![false; 16])), 2);
        assert!(none.pixels.iter().all(|p| *p == Pixel::Masked));
    }

    #[test]
    fn a_sheet_has_the_size_its_layout_says() {
        let sheet = Sheet {
            title: "t".into(),
            lines: vec!["a line".into()],
            panels: vec![matrix(4, 4, None), matrix(4, 4, None), matrix(4, 4, None)],
            columns: 2,
            panel_px: 100,
            scale: Scale::Shared,
            bar_label: "W".into(),
        };
        let image = sheet.render().unwrap();
        let slot = 100; // 4 cells of 25 px
        let grid_w = 2 * (Y_TICKS + slot) + GAP;
        assert_eq!(image.width as i32, MARGIN + grid_w + BAR_BAND + MARGIN);
        let top = MARGIN + TITLE + LINE + 6;
        let grid_h = 2 * (LABEL + slot + X_TICKS) + GAP;
        let bar = LABEL + 120 + X_TICKS;
        assert_eq!(image.height as i32, top + grid_h.max(bar) + LEGEND + MARGIN);
        // Something was drawn in the panels' colours: not all white.
        assert!(image.rgb.chunks(3).any(|p| p[0] > 200 && p[2] < 120));
    }
}
