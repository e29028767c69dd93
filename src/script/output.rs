//! What scripts leave behind: CSV files, SVG and PNG charts (plotters) and
//! aligned tables on stdout.

use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use rhai::{Array, Dynamic, Map};

/// A whole drawing surface.
type Area<DB> = DrawingArea<DB, plotters::coord::Shift>;

/// A chart on two float axes.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Draws the series' legend box.
fn legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// Makes the bundled DejaVu Sans the charts' font, once: the text of a PNG
/// is drawn with it, and SVG text is measured with it (no system fonts needed).
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let font: &'static [u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
        // The font is a valid TrueType file compiled in: registering cannot fail.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, font);
    });
}

/// The columns of `rows` (maps): every key, in first-seen order.
fn columns(rows: &[Map]) -> Vec<String> {
    let mut cols: Vec<String> = Vec::new();
    for row in rows {
        for k in row.keys() {
            if !cols.iter().any(|c| c == k.as_str()) {
                cols.push(k.to_string());
            }
        }
    }
    cols
}

/// The rows of an array of maps; an error names the first element that is not one.
pub fn maps(rows: &Array, call: &str) -> Result<Vec<Map>, String> {
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            r.clone().try_cast::<Map>().ok_or_else(|| format!("{call}: row {i} is a {}, not a map", r.type_name()))
        })
        .collect()
}

/// A value as a CSV or table cell: floats with up to 6 decimals, trailing
/// zeros dropped, and below 0.001 in scientific notation with 4 significant
/// digits (a KL divergence of 3e-5 must not read as 0).
fn cell(v: Option<&Dynamic>) -> String {
    match v {
        None => String::new(),
        Some(v) if v.is_unit() => String::new(),
        Some(v) => match v.as_float() {
            Ok(f) if f.fract() != 0.0 && f.abs() < 1e-3 => format!("{f:.3e}"),
            Ok(f) if f.fract() != 0.0 => {
                let fixed = format!("{f:.6}");
                fixed.trim_end_matches('0').trim_end_matches('.').to_string()
            }
            _ => v.to_string(),
        },
    }
}

/// Quotes a CSV field when it needs it.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// Writes `rows` as CSV (a header of every key) to `path`.
pub fn write_csv(path: &Path, rows: &[Map]) -> Result<(), String> {
    let cols = columns(rows);
    let mut text = cols.iter().map(|c| csv_field(c)).collect::<Vec<_>>().join(",");
    text.push('\n');
    for row in rows {
        let line: Vec<String> = cols.iter().map(|c| csv_field(&cell(row.get(c.as_str())))).collect();
        let _ = writeln!(text, "{}", line.join(","));
    }
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// `rows` as an aligned text table (numbers right-aligned).
pub fn table(rows: &[Map]) -> String {
    let cols = columns(rows);
    let cells: Vec<Vec<String>> = rows.iter().map(|r| cols.iter().map(|c| cell(r.get(c.as_str()))).collect()).collect();
    let widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| cells.iter().map(|r| r[i].chars().count()).chain([c.chars().count()]).max().unwrap_or(0))
        .collect();
    let numeric: Vec<bool> =
        (0..cols.len()).map(|i| cells.iter().all(|r| r[i].is_empty() || r[i].parse::<f64>().is_ok())).collect();
    let mut out = String::new();
    let line = |values: &[String], out: &mut String| {
        let parts: Vec<String> = values
            .iter()
            .enumerate()
            .map(
                |(i, v)| if numeric[i] { format!("{v:>w$}", w = widths[i]) } else { format!("{v:<w$}", w = widths[i]) },
            )
            .collect();
        let _ = writeln!(out, "{}", parts.join("  ").trim_end());
    };
    line(&cols, &mut out);
    let _ = writeln!(out, "{}", widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
    for r in &cells {
        line(r, &mut out);
    }
    out
}

/// A chart's description: `#{kind, x, series, title, x_label, y_label}`.
pub struct ChartSpec {
    kind: String,
    title: String,
    x_label: String,
    y_label: String,
    x: Vec<Dynamic>,
    series: Vec<(String, Vec<f64>)>,
    rows: Vec<String>,
}

fn numbers(a: &Dynamic, what: &str) -> Result<Vec<f64>, String> {
    let arr = a.clone().try_cast::<Array>().ok_or_else(|| format!("{what} must be an array of numbers"))?;
    arr.iter()
        .map(|v| {
            v.as_float().or_else(|_| v.as_int().map(|i| i as f64)).map_err(|_| format!("{what}: `{v}` is not a number"))
        })
        .collect()
}

impl ChartSpec {
    /// Reads a chart map. `line`: `x` numbers, `series` a map of name to
    /// numbers. `bar`: `x` labels, `series` as for line (bars grouped per
    /// label). `heatmap`: `x` column labels, `y` row labels, `series` an
    /// array of rows of numbers.
    pub fn from_map(m: &Map) -> Result<ChartSpec, String> {
        let text = |k: &str| m.get(k).map(|v| v.to_string()).unwrap_or_default();
        let kind = text("kind");
        let x: Vec<Dynamic> =
            m.get("x").and_then(|v| v.clone().try_cast::<Array>()).ok_or("chart needs `x`: an array")?;
        let series_value = m.get("series").ok_or("chart needs `series`")?;
        let (series, rows) = match kind.as_str() {
            "line" | "bar" => {
                let map = series_value.clone().try_cast::<Map>().ok_or("`series` must be a map of name to numbers")?;
                let mut series = Vec::new();
                for (name, values) in map {
                    let v = numbers(&values, &format!("series `{name}`"))?;
                    if v.len() != x.len() {
                        return Err(format!("series `{name}` has {} values for {} x values", v.len(), x.len()));
                    }
                    series.push((name.to_string(), v));
                }
                (series, Vec::new())
            }
            "heatmap" => {
                let arr =
                    series_value.clone().try_cast::<Array>().ok_or("heatmap `series` must be an array of rows")?;
                let labels: Vec<String> = m
                    .get("y")
                    .and_then(|v| v.clone().try_cast::<Array>())
                    .map(|a| a.iter().map(|v| v.to_string()).collect())
                    .unwrap_or_else(|| (0..arr.len()).map(|i| i.to_string()).collect());
                let mut series = Vec::new();
                for (i, row) in arr.iter().enumerate() {
                    let v = numbers(row, &format!("row {i}"))?;
                    if v.len() != x.len() {
                        return Err(format!("heatmap row {i} has {} values for {} columns", v.len(), x.len()));
                    }
                    series.push((labels.get(i).cloned().unwrap_or_default(), v));
                }
                (series, labels)
            }
            other => return Err(format!("chart kind `{other}`: line, bar or heatmap")),
        };
        if series.is_empty() || x.is_empty() {
            return Err("chart has no data".into());
        }
        Ok(ChartSpec {
            kind,
            title: text("title"),
            x_label: text("x_label"),
            y_label: text("y_label"),
            x,
            series,
            rows,
        })
    }

    /// Draws the chart into `path`: SVG for `.svg`, PNG for `.png`.
    pub fn draw(&self, path: &Path) -> Result<(), String> {
        register_font();
        let size = (900, 560);
        let result = match path.extension().and_then(|e| e.to_str()) {
            Some("svg") => self.draw_on(&SVGBackend::new(path, size).into_drawing_area()),
            Some("png") => self.draw_on(&BitMapBackend::new(path, size).into_drawing_area()),
            _ => Err("name the file .svg or .png".to_string()),
        };
        result.map_err(|e| format!("drawing {}: {e}", path.display()))
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &Area<DB>) -> Result<(), String> {
        match self.kind.as_str() {
            "line" => self.line(root),
            "bar" => self.bar(root),
            _ => self.heatmap(root),
        }?;
        root.present().map_err(|e| e.to_string())
    }

    /// The chart's frame: title, margins, label areas and axes' ranges.
    fn frame<'a, DB: DrawingBackend>(
        &self,
        root: &'a Area<DB>,
        x: std::ops::Range<f64>,
        y: std::ops::Range<f64>,
        y_labels: u32,
    ) -> Result<Chart<'a, DB>, String> {
        ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(if y_labels > 30 { 40 } else { 30 })
            .y_label_area_size(y_labels)
            .build_cartesian_2d(x, y)
            .map_err(|e| e.to_string())
    }

    fn y_range(&self) -> (f64, f64) {
        let all = self.series.iter().flat_map(|(_, v)| v.iter().copied()).filter(|v| v.is_finite());
        let (lo, hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
        let lo = lo.min(0.0);
        let hi = if hi > lo { hi * 1.05 } else { lo + 1.0 };
        (lo, hi)
    }

    fn line<DB: DrawingBackend>(&self, root: &Area<DB>) -> Result<(), String> {
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let xs = numbers(&Dynamic::from_array(self.x.clone()), "x")?;
        let (x0, x1) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
        let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
        let (y0, y1) = self.y_range();
        let mut chart = self.frame(root, x0..x1, y0..y1, 60)?;
        chart.configure_mesh().x_desc(&self.x_label).y_desc(&self.y_label).draw().map_err(|e| e.to_string())?;
        for (i, (name, ys)) in self.series.iter().enumerate() {
            let colour = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> =
                xs.iter().copied().zip(ys.iter().copied()).filter(|p| p.1.is_finite()).collect();
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
            chart
                .draw_series(points.into_iter().map(|p| Circle::new(p, 3, colour.filled())))
                .map_err(|e| e.to_string())?;
        }
        legend(&mut chart)
    }

    fn bar<DB: DrawingBackend>(&self, root: &Area<DB>) -> Result<(), String> {
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let labels: Vec<String> = self.x.iter().map(|v| v.to_string()).collect();
        let groups = labels.len() as f64;
        let (y0, y1) = self.y_range();
        let mut chart = self.frame(root, 0.0..groups, y0..y1, 60)?;
        // No ticks from the mesh (it would place them at round numbers of the
        // float axis, not at the groups): each group's label is drawn under its
        // centre instead.
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .draw()
            .map_err(|e| e.to_string())?;
        let style = ("sans-serif", 14).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
        for (g, label) in labels.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(g as f64 + 0.5, y0));
            root.draw(&Text::new(label.clone(), (px, py + 6), style.clone())).map_err(|e| e.to_string())?;
        }
        let width = 0.8 / self.series.len() as f64;
        for (i, (name, ys)) in self.series.iter().enumerate() {
            let colour = Palette99::pick(i).to_rgba();
            let bars = ys.iter().enumerate().map(|(g, &y)| {
                let left = g as f64 + 0.1 + i as f64 * width;
                Rectangle::new([(left, 0.0), (left + width, if y.is_finite() { y } else { 0.0 })], colour.filled())
            });
            chart
                .draw_series(bars)
                .map_err(|e| e.to_string())?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        }
        legend(&mut chart)
    }

    fn heatmap<DB: DrawingBackend>(&self, root: &Area<DB>) -> Result<(), String> {
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let cols: Vec<String> = self.x.iter().map(|v| v.to_string()).collect();
        let values = || self.series.iter().flat_map(|(_, v)| v.iter().copied()).filter(|v| v.is_finite());
        let lo = values().fold(f64::INFINITY, f64::min);
        let hi = values().fold(f64::NEG_INFINITY, f64::max);
        let mut chart = self.frame(root, 0.0..cols.len() as f64, 0.0..self.rows.len() as f64, 30)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(0)
            .y_labels(0)
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .draw()
            .map_err(|e| e.to_string())?;
        // Blue (lowest) to red (highest); every cell is labelled with its row, column and value.
        let span = (hi - lo).max(1e-12);
        let colour = |v: f64| {
            let t = if v.is_finite() { ((v - lo) / span).clamp(0.0, 1.0) } else { 0.0 };
            HSLColor(0.66 - 0.66 * t, 0.7, 0.75)
        };
        let n_rows = self.series.len();
        let cells = self.series.iter().enumerate().flat_map(|(r, (_, vs))| {
            // The first row is drawn at the top.
            let y = (n_rows - 1 - r) as f64;
            vs.iter()
                .enumerate()
                .map(move |(c, &v)| Rectangle::new([(c as f64, y), (c as f64 + 1.0, y + 1.0)], colour(v).filled()))
        });
        chart.draw_series(cells).map_err(|e| e.to_string())?;
        let style = ("sans-serif", 16).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Center));
        let labels = self.series.iter().enumerate().flat_map(|(r, (row, vs))| {
            let y = (n_rows - 1 - r) as f64 + 0.5;
            let (cols, style) = (&cols, style.clone());
            vs.iter().enumerate().map(move |(c, &v)| {
                Text::new(format!("{row} / {}: {v:.1}", cols[c]), (c as f64 + 0.5, y), style.clone())
            })
        });
        chart.draw_series(labels).map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pairs: &[(&str, Dynamic)]) -> Map {
        pairs.iter().map(|(k, v)| ((*k).into(), v.clone())).collect()
    }

    #[test]
    fn csv_and_table_take_every_key_in_first_seen_order() {
        let rows = vec![
            row(&[("policy", "lru".into()), ("hit", Dynamic::from_float(0.5))]),
            row(&[("policy", "a,b".into()), ("hit", Dynamic::from_float(0.25)), ("extra", 3_i64.into())]),
        ];
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv");
        write_csv(&p, &rows).unwrap();
        // Rhai maps keep their keys sorted; a key first seen in a later row comes last.
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "hit,policy,extra\n0.5,lru,\n0.25,\"a,b\",3\n");
        let t = table(&rows);
        assert_eq!(t, " hit  policy  extra\n----  ------  -----\n 0.5  lru\n0.25  a,b         3\n");
        // Small values keep their digits; others keep six decimals at most.
        let small = [row(&[("kl", Dynamic::from_float(3.25e-5))]), row(&[("kl", Dynamic::from_float(1.0 / 3.0))])];
        write_csv(&p, &small).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "kl\n3.250e-5\n0.333333\n");
    }

    #[test]
    fn charts_are_checked_then_drawn_as_svg() {
        let dir = tempfile::tempdir().unwrap();
        let x: Array = vec![1_i64.into(), 2_i64.into(), 3_i64.into()];
        let ys: Array = vec![Dynamic::from_float(0.1), Dynamic::from_float(0.5), Dynamic::from_float(0.4)];
        let mut series = Map::new();
        series.insert("lru".into(), ys.clone().into());
        for kind in ["line", "bar"] {
            let spec = row(&[
                ("kind", kind.into()),
                ("x", x.clone().into()),
                ("series", series.clone().into()),
                ("title", "t".into()),
            ]);
            let p = dir.path().join(format!("{kind}.svg"));
            ChartSpec::from_map(&spec).unwrap().draw(&p).unwrap();
            assert!(std::fs::read_to_string(&p).unwrap().starts_with("<svg"));
        }
        // A bar chart labels every group under its bars, once.
        let groups: Array = vec!["cache0".into(), "default".into(), "file-layout".into()];
        let spec = row(&[("kind", "bar".into()), ("x", groups.into()), ("series", series.clone().into())]);
        let p = dir.path().join("groups.svg");
        ChartSpec::from_map(&spec).unwrap().draw(&p).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        let x_of = |label: &str| -> f64 {
            let end = svg.find(&format!(">\n{label}\n</text>")).unwrap_or_else(|| panic!("{label} missing: {svg}"));
            let tag = &svg[svg[..end].rfind("<text").unwrap()..end];
            tag.split("x=\"").nth(1).and_then(|v| v.split('"').next()).unwrap().parse().unwrap()
        };
        let xs: Vec<f64> = ["cache0", "default", "file-layout"].into_iter().map(x_of).collect();
        // Under the centres of three equal groups: evenly spaced, half a step in from the axis.
        let step = xs[1] - xs[0];
        assert!(step > 100.0 && (xs[2] - xs[1] - step).abs() <= 1.0, "{xs:?}");
        assert!(xs[0] - step / 2.0 > 0.0 && xs[2] + step / 2.0 < 900.0, "{xs:?}");
        let heat: Array = vec![ys.clone().into(), ys.into()];
        let spec = row(&[("kind", "heatmap".into()), ("x", x.clone().into()), ("series", heat.into())]);
        ChartSpec::from_map(&spec).unwrap().draw(&dir.path().join("h.svg")).unwrap();
        let short: Array = vec![Dynamic::from_float(1.0)];
        series.insert("bad".into(), short.into());
        let spec = row(&[("kind", "line".into()), ("x", x.into()), ("series", series.into())]);
        assert!(ChartSpec::from_map(&spec).err().unwrap().contains("has 1 values for 3"));
    }
}
