/**
 * `mod.ts list`: the models of the local store (tools/cli/models.ts) with their size on disk,
 * architecture, weight formats and floor (the least budget they run in, at the default context).
 *
 * @module
 */
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { openContainer } from "../../engine/container.ts";
import { runFloor } from "../../engine/model.ts";
import { formatBytes } from "../../engine/units.ts";
import { HELP_FLAG, helpShown, parseCommandArgs } from "./args.ts";
import { modelsDir, storeModels } from "./models.ts";

const HELP = `sluice list — the models of the local store

Usage: deno run -A mod.ts list [--json]

The store is $SLUICE_MODELS, else $XDG_DATA_HOME/sluice/models, else ~/.local/share/sluice/models.
'pull org/name' writes there by default, and '-m NAME' finds a model there by its name.
Columns: name, size on disk, architecture (model_type), weight formats (trunk / experts) and
floor, the least --budget it runs in at the default context (min(model, 4096)).

  --json      one JSON array
  -h, --help  this text
`;

/** One model of the store as `list` shows it. */
export interface StoreEntry {
  name: string;
  path: string;
  bytes: number;
  architecture: string;
  format: string;
  floor: number;
}

/** Bytes of the files in a container folder. */
function folderBytes(dir: string): number {
  return readdirSync(dir).reduce((n, f) => n + statSync(join(dir, f)).size, 0);
}

/** The store's models; a container that does not open is listed with why. */
export function listStore(): (StoreEntry | { name: string; path: string; error: string })[] {
  return [...storeModels()].map(([name, path]) => {
    try {
      const c = openContainer(path);
      const dtypes = new Set(
        Object.values(c.manifest.trunk.layers[0]?.tensors ?? {}).map((t) => t.dtype),
      );
      const experts = new Set(c.manifest.experts.flatMap((b) => (b ? [b.format] : [])));
      const format = [...dtypes].join("+") + (experts.size ? ` / ${[...experts].join("+")}` : "");
      const floor = runFloor(c);
      return {
        name,
        path,
        bytes: folderBytes(path),
        architecture: c.config.modelType,
        format,
        floor,
      };
    } catch (e) {
      return { name, path, error: (e as Error).message };
    }
  });
}

/** Runs the list command; returns the exit code. */
export function listCommand(args: string[]): Promise<number> {
  const a = parseCommandArgs("list", args, { json: { type: "boolean" }, ...HELP_FLAG });
  if (helpShown(a, HELP)) return Promise.resolve(0);
  const entries = listStore();
  if (a.bool("json")) {
    console.log(JSON.stringify(entries));
    return Promise.resolve(0);
  }
  if (entries.length === 0) {
    console.log(`no models in ${modelsDir()} yet: 'sluice pull org/name' puts one there`);
    return Promise.resolve(0);
  }
  const rows = entries.map((e) =>
    "error" in e
      ? [e.name, "-", "-", "-", "-", `(does not open: ${e.error})`]
      : [e.name, formatBytes(e.bytes), e.architecture, e.format, formatBytes(e.floor), ""]
  );
  const head = ["NAME", "SIZE", "ARCHITECTURE", "FORMAT", "FLOOR", ""];
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  for (const r of [head, ...rows]) {
    console.log(r.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd());
  }
  console.log(`(${modelsDir()})`);
  return Promise.resolve(0);
}
