//! Pictures as PNG files, with no system library: plotters draws into an RGB buffer
//! (its bitmap backend), text comes from a font compiled into the binary (plotters'
//! `ab_glyph` feature; a subset of DejaVu Sans, `assets/fonts/`, Bitstream Vera license),
//! and the `png` crate encodes the buffer. The pure parts are [`colormap`] (signed values to
//! colours) and [`bins`] (logarithmic histograms); [`heatmap`] and [`histogram`] draw.
//!
//! Nothing here knows what the pictures are of: callers pass matrices and counts.

pub mod bins;
pub mod colormap;
pub mod heatmap;
pub mod histogram;

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::{BitMapBackend, DrawingArea, DrawingAreaErrorKind, IntoDrawingArea};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::fs::PendingFile;

/// The font family every picture's text uses. Sizes are even numbers of pixels: plotters
/// 0.3.7 places each glyph at `size / 2 + top of its pixel box`, truncated toward zero,
/// which at odd sizes lifts small glyphs (`.`, `,`) a pixel above the baseline.
pub const FONT: &str = "sans-serif";

/// DejaVu Sans, subset to ASCII and a few symbols (`assets/fonts/README.md`).
static REGULAR: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-subset.ttf");
/// DejaVu Sans Bold, the same subset.
static BOLD: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-Bold-subset.ttf");

/// Most pixels one picture may have (its RGB buffer is 3 bytes a pixel).
pub const MAX_PIXELS: u64 = 1 << 25;

/// Registers the embedded fonts with plotters (once per process).
fn register_fonts() -> Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        use plotters::style::{register_font, FontStyle};
        register_font(FONT, FontStyle::Normal, REGULAR).is_ok()
            && register_font(FONT, FontStyle::Bold, BOLD).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Internal("the embedded font does not load".into()))
    }
}

/// A picture file written: where, and its size in pixels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlotFile {
    /// The PNG file.
    pub file: PathBuf,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// An RGB picture in memory.
#[derive(Clone, Debug)]
pub struct Image {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Row-major RGB bytes, 3 per pixel.
    pub rgb: Vec<u8>,
}

/// The drawing area plotters paints on.
pub type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// A drawing error of plotters, as this crate's error.
pub fn drawing_error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> Error {
    Error::Internal(format!("drawing a picture failed: {e}"))
}

impl Image {
    /// A `width` × `height` picture on a white ground, painted by `paint`.
    pub fn draw(
        width: u32,
        height: u32,
        paint: impl FnOnce(&Area<'_>) -> Result<()>,
    ) -> Result<Image> {
        let pixels = u64::from(width) * u64::from(height);
        if pixels == 0 || pixels > MAX_PIXELS {
            return Err(Error::TooLarge(format!(
                "a {width} x {height} picture is outside 1..={MAX_PIXELS} pixels"
            )));
        }
        register_fonts()?;
        let mut rgb = vec![255u8; pixels as usize * 3];
        {
            let area = BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
            paint(&area)?;
            area.present().map_err(drawing_error)?;
        }
        Ok(Image { width, height, rgb })
    }

    /// The picture as PNG bytes (8-bit RGB).
    pub fn png(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, self.width, self.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_compression(png::Compression::High);
        let fail = |e: png::EncodingError| Error::Internal(format!("PNG encoding failed: {e}"));
        let mut writer = encoder.write_header().map_err(fail)?;
        writer.write_image_data(&self.rgb).map_err(fail)?;
        writer.finish().map_err(fail)?;
        Ok(out)
    }
}

/// Writes every picture as PNG into `dir` (created if missing) under its file name: all or
/// none, each renamed into place once every one is complete.
pub fn write_pngs(dir: &Path, pictures: &[(String, Image)]) -> Result<Vec<PlotFile>> {
    let mut created = crate::fs::CreatedDirs::new();
    if dir.exists() && !dir.is_dir() {
        return Err(Error::OutputPath(format!(
            "picture directory {} is not a directory",
            dir.display()
        )));
    }
    created.create(dir)?;
    let mut pending = Vec::with_capacity(pictures.len());
    let mut written = Vec::with_capacity(pictures.len());
    for (name, image) in pictures {
        let path = dir.join(name);
        let mut file = PendingFile::create(&path)?;
        let bytes = image.png()?;
        std::io::Write::write_all(file.writer(), &bytes).map_err(|e| Error::io(&path, e))?;
        pending.push(file);
        written.push(PlotFile {
            file: path,
            width: image.width,
            height: image.height,
        });
    }
    PendingFile::persist_all(pending)?;
    created.commit();
    Ok(written)
}

/// A file name made of `parts` joined by `_`, each reduced to letters, digits, `.` and `-`
/// (other characters become `-`), ending in `.png`.
pub fn file_name(parts: &[&str]) -> String {
    let clean: Vec<String> = parts
        .iter()
        .map(|p| {
            p.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect()
        })
        .collect();
    format!("{}.png", clean.join("_"))
}

/// `v` in at most 3 significant digits: `0.174`, `-2.5e-5`, `0`.
pub fn number(v: f64) -> String {
    if v == 0.0 {
        "0".to_string()
    } else if (1e-3..1e4).contains(&v.abs()) {
        let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
        let s = format!("{v:.digits$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    } else {
        format!("{v:.1e}")
    }
}

/// [`number`] with true minus signs, for pictures: `−2.5e−5`.
pub fn signed(v: f64) -> String {
    number(v).replace('-', "\u{2212}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_keep_only_safe_characters() {
        assert_eq!(
            file_name(&["tract", "ort-cpu", "present_sgu.0"]),
            "tract_ort-cpu_present-sgu.0.png"
        );
        assert_eq!(file_name(&["a/b", "c d"]), "a-b_c-d.png");
    }

    #[test]
    fn an_image_encodes_as_a_png_of_its_size() {
        let image = Image::draw(7, 5, |_| Ok(())).unwrap();
        let bytes = image.png().unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&bytes[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 7);
        assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), 5);
        assert!(Image::draw(0, 5, |_| Ok(())).is_err());
        assert!(Image::draw(1 << 13, 1 << 13, |_| Ok(())).is_err());
    }

    #[test]
    fn numbers_are_short_and_use_a_true_minus() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(0.17423), "0.174");
        assert_eq!(number(-0.5), "-0.5");
        assert_eq!(signed(-0.5), "\u{2212}0.5");
        assert_eq!(number(12.345), "12.3");
        assert_eq!(number(2.0), "2");
        assert_eq!(number(-2.5e-5), "-2.5e-5");
        assert_eq!(signed(-2.5e-5), "\u{2212}2.5e\u{2212}5");
        assert_eq!(number(123456.0), "1.2e5");
    }
}
