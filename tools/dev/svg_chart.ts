/**
 * A small dependency-free SVG line-chart writer (axes with round ticks, markers, legend), used by
 * tools/dev/sim.ts and the benches.
 *
 * @module
 */

/** One line of a chart. */
export interface Series {
  name: string;
  points: [number, number][];
  /** CSS colour; default: taken from a fixed palette in order. */
  color?: string;
  /** Draw the line dashed (e.g. a second mode of the same quantity). */
  dashed?: boolean;
}

/** What to draw. */
export interface LineChart {
  title: string;
  xLabel: string;
  yLabel: string;
  series: Series[];
  width?: number;
  height?: number;
  /** Axis ranges; default: the data's range (y from 0 when all values are ≥ 0). */
  xMin?: number;
  xMax?: number;
  yMin?: number;
  yMax?: number;
}

const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"];

function escapeXml(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(
    /"/g,
    "&quot;",
  );
}

/** About `count` round tick values (1, 2 or 5 × 10^n apart) covering [lo, hi]. */
export function niceTicks(lo: number, hi: number, count = 6): number[] {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / Math.max(1, count - 1);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? 10 * mag;
  const ticks: number[] = [];
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push(Number(v.toPrecision(12)));
  }
  return ticks;
}

function fmt(v: number): string {
  return Number(v.toPrecision(6)).toString();
}

/** Renders the chart as an SVG document. */
export function renderLineChart(chart: LineChart): string {
  const width = chart.width ?? 720, height = chart.height ?? 440;
  const left = 64, right = 190, top = 40, bottom = 56;
  const pw = width - left - right, ph = height - top - bottom;
  const xs = chart.series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = chart.series.flatMap((s) => s.points.map((p) => p[1]));
  let xMin = chart.xMin ?? (xs.length ? Math.min(...xs) : 0);
  let xMax = chart.xMax ?? (xs.length ? Math.max(...xs) : 1);
  let yMin = chart.yMin ?? (ys.length ? Math.min(0, ...ys) : 0);
  let yMax = chart.yMax ?? (ys.length ? Math.max(...ys) : 1);
  if (!(xMax > xMin)) [xMin, xMax] = [xMin - 0.5, xMin + 0.5];
  if (!(yMax > yMin)) [yMin, yMax] = [yMin - 0.5, yMin + 0.5];
  // Pixel coordinates, rounded to 0.1 px to keep the file small and readable.
  const X = (x: number) => Math.round((left + ((x - xMin) / (xMax - xMin)) * pw) * 10) / 10;
  const Y = (y: number) => Math.round((top + ph - ((y - yMin) / (yMax - yMin)) * ph) * 10) / 10;
  const out: string[] = [];
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" ` +
      `viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="${width}" height="${height}" fill="white"/>`,
    `<text x="${left + pw / 2}" y="22" text-anchor="middle" font-size="15">` +
      `${escapeXml(chart.title)}</text>`,
  );
  for (const t of niceTicks(xMin, xMax)) {
    if (t < xMin || t > xMax) continue;
    out.push(
      `<line x1="${X(t)}" y1="${top}" x2="${X(t)}" y2="${top + ph}" stroke="#e5e5e5"/>`,
      `<text x="${X(t)}" y="${top + ph + 16}" text-anchor="middle">${fmt(t)}</text>`,
    );
  }
  for (const t of niceTicks(yMin, yMax)) {
    if (t < yMin || t > yMax) continue;
    out.push(
      `<line x1="${left}" y1="${Y(t)}" x2="${left + pw}" y2="${Y(t)}" stroke="#e5e5e5"/>`,
      `<text x="${left - 6}" y="${Y(t) + 4}" text-anchor="end">${fmt(t)}</text>`,
    );
  }
  out.push(
    `<rect x="${left}" y="${top}" width="${pw}" height="${ph}" fill="none" stroke="#333"/>`,
    `<text x="${left + pw / 2}" y="${height - 14}" text-anchor="middle">` +
      `${escapeXml(chart.xLabel)}</text>`,
    `<text transform="translate(16 ${top + ph / 2}) rotate(-90)" text-anchor="middle">` +
      `${escapeXml(chart.yLabel)}</text>`,
  );
  chart.series.forEach((s, i) => {
    const color = s.color ?? PALETTE[i % PALETTE.length];
    const dash = s.dashed ? ` stroke-dasharray="6 4"` : "";
    const pts = [...s.points].sort((a, b) => a[0] - b[0]);
    const d = pts.map((p) => `${X(p[0])},${Y(p[1])}`).join(" ");
    out.push(`<polyline points="${d}" fill="none" stroke="${color}" stroke-width="2"${dash}/>`);
    for (const p of pts) {
      out.push(
        `<circle cx="${X(p[0])}" cy="${Y(p[1])}" r="3" fill="${color}"/>`,
      );
    }
    const ly = top + 10 + i * 20;
    out.push(
      `<line x1="${left + pw + 14}" y1="${ly}" x2="${left + pw + 44}" y2="${ly}" ` +
        `stroke="${color}" stroke-width="2"${dash}/>`,
      `<text x="${left + pw + 50}" y="${ly + 4}">${escapeXml(s.name)}</text>`,
    );
  });
  out.push(`</svg>`);
  return out.join("\n") + "\n";
}

/** Renders the chart and writes it to `path` (through a temporary file and a rename). */
export function writeLineChart(path: string, chart: LineChart): void {
  Deno.writeTextFileSync(`${path}.tmp`, renderLineChart(chart));
  Deno.renameSync(`${path}.tmp`, path);
}
