/**
 * A small dependency-free SVG grouped bar chart (one group per comparison, one bar per series),
 * for `deno task bench compare`.
 *
 * @module
 */

/** What to draw: `values[s][g]` is series s in group g (null = no bar). */
export interface BarChart {
  title: string;
  yLabel: string;
  groups: string[];
  series: { name: string; color: string; values: (number | null)[] }[];
  width?: number;
  height?: number;
}

function esc(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/** The chart as an SVG document; bars carry their value as a label. */
export function renderBarChart(c: BarChart): string {
  const w = c.width ?? 760, h = c.height ?? 380;
  const left = 60, right = 20, top = 40, bottom = 70;
  const plotW = w - left - right, plotH = h - top - bottom;
  const all = c.series.flatMap((s) => s.values.filter((v): v is number => v !== null));
  const yMax = Math.max(1e-9, ...all) * 1.15;
  const y = (v: number) => top + plotH - (v / yMax) * plotH;
  const groupW = plotW / Math.max(1, c.groups.length);
  const barW = (groupW * 0.8) / Math.max(1, c.series.length);
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" font-family="sans-serif" font-size="12">`,
    `<rect width="${w}" height="${h}" fill="white"/>`,
    `<text x="${w / 2}" y="22" text-anchor="middle" font-size="15">${esc(c.title)}</text>`,
    `<line x1="${left}" y1="${top + plotH}" x2="${left + plotW}" y2="${
      top + plotH
    }" stroke="#333"/>`,
    `<line x1="${left}" y1="${top}" x2="${left}" y2="${top + plotH}" stroke="#333"/>`,
    `<text transform="translate(16 ${top + plotH / 2}) rotate(-90)" text-anchor="middle">${
      esc(c.yLabel)
    }</text>`,
  ];
  c.groups.forEach((g, gi) => {
    const gx = left + gi * groupW + groupW * 0.1;
    c.series.forEach((s, si) => {
      const v = s.values[gi];
      if (v === null || v === undefined) return;
      const x = gx + si * barW;
      out.push(
        `<rect x="${x.toFixed(1)}" y="${y(v).toFixed(1)}" width="${(barW - 2).toFixed(1)}" ` +
          `height="${(top + plotH - y(v)).toFixed(1)}" fill="${s.color}"/>`,
        `<text x="${(x + barW / 2).toFixed(1)}" y="${(y(v) - 4).toFixed(1)}" ` +
          `text-anchor="middle" font-size="10">${v.toPrecision(3)}</text>`,
      );
    });
    out.push(
      `<text x="${(left + (gi + 0.5) * groupW).toFixed(1)}" y="${top + plotH + 18}" ` +
        `text-anchor="middle">${esc(g)}</text>`,
    );
  });
  c.series.forEach((s, si) => {
    const lx = left + si * 170, ly = h - 18;
    out.push(
      `<rect x="${lx}" y="${ly - 10}" width="12" height="12" fill="${s.color}"/>`,
      `<text x="${lx + 18}" y="${ly}">${esc(s.name)}</text>`,
    );
  });
  out.push("</svg>");
  return out.join("\n") + "\n";
}
