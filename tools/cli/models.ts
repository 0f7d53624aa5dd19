/**
 * Models by name, as ollama and `llama-cli -hf` users expect: a local store of containers
 * (`$SLUICE_MODELS`, else `$XDG_DATA_HOME/sluice/models`, else `~/.local/share/sluice/models`)
 * that `pull` writes into by default and that `-m NAME` and `list` read. `-m org/repo` for a model
 * the store lacks offers to pull and pack it (asked on a terminal, refused otherwise); a
 * checkpoint folder or a GGUF file given to `-m` is answered with what to run instead.
 *
 * @module
 */
import {
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  statSync,
} from "node:fs";
import { homedir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { didYouMean } from "./args.ts";

/** The model store's folder. */
export function modelsDir(): string {
  const own = Deno.env.get("SLUICE_MODELS");
  if (own) return own;
  const data = Deno.env.get("XDG_DATA_HOME") || join(homedir(), ".local", "share");
  return join(data, "sluice", "models");
}

/** A Hub repo id (`org/name`, optionally `@revision`), as `pull` takes it. */
const HUB_ID = /^[A-Za-z0-9][\w.-]*\/[\w.-]+(@[\w./-]+)?$/;

/** The store's path for a model name (a Hub id keeps its org as a folder; no revision). */
export function storePath(name: string, root = modelsDir()): string {
  const base = name.replace(/@.*$/, "").replace(/\.sluice$/, "");
  if (!/^[\w.-]+(\/[\w.-]+)?$/.test(base) || base.split("/").some((p) => /^\.+$/.test(p))) {
    throw new Error(`"${name}" is not a model name (letters, digits, . _ - and one "/")`);
  }
  return join(root, `${base}.sluice`);
}

/** The containers of the store: name (path below the store, without `.sluice`) → path. */
export function storeModels(root = modelsDir()): Map<string, string> {
  const out = new Map<string, string>();
  const scan = (dir: string, prefix: string, depth: number) => {
    let entries: Deno.DirEntry[];
    try {
      entries = [...Deno.readDirSync(dir)];
    } catch {
      return;
    }
    for (const e of entries.sort((a, b) => a.name.localeCompare(b.name))) {
      if (!e.isDirectory) continue;
      const path = join(dir, e.name);
      if (e.name.endsWith(".sluice") && existsSync(join(path, "manifest.json"))) {
        out.set(prefix + e.name.slice(0, -".sluice".length), path);
      } else if (depth > 0 && !e.name.includes(".")) {
        scan(path, `${prefix}${e.name}/`, depth - 1);
      }
    }
  };
  scan(root, "", 1);
  return out;
}

/** Whether `path` begins with GGUF's magic. */
function isGguf(path: string): boolean {
  const fd = openSync(path, "r");
  try {
    const head = new Uint8Array(4);
    return readSync(fd, head, 0, 4, 0) === 4 && new TextDecoder().decode(head) === "GGUF";
  } finally {
    closeSync(fd);
  }
}

/**
 * Why `path` (which exists and is not a container) cannot be run, and what to do instead; null
 * when it is neither a checkpoint nor a GGUF file.
 */
export function notAContainer(path: string): string | null {
  const st = statSync(path);
  if (st.isFile()) {
    if (path.toLowerCase().endsWith(".gguf") || isGguf(path)) {
      return `${path}: a GGUF file, which sluice does not read yet: pack the Hugging Face ` +
        "checkpoint it was made from (`sluice pull org/name`, or `sluice pack DIR`)";
    }
    return null;
  }
  const names = readdirSync(path);
  const hubCache = /(^|\/)models--[^/]+--[^/]+\/?$/.test(resolve(path)) && names.includes("refs");
  if (
    hubCache || (names.includes("config.json") && names.some((n) => n.endsWith(".safetensors")))
  ) {
    return `${path}: this is a checkpoint: run \`sluice pack ${path}\` (deno run -A mod.ts ` +
      `pack ${path} NAME.sluice) and give the container to -m`;
  }
  return null;
}

/** Asks a yes/no question on the terminal; false on anything but y/yes. */
function askTerminal(question: string): boolean {
  const answer = prompt(`${question} [y/N]`);
  return answer !== null && /^y(es)?$/i.test(answer.trim());
}

/** How {@link resolveModel} pulls a missing Hub model into the store (tools/pull). */
export type Puller = (spec: string, out: string) => Promise<void>;

/**
 * The container `-m` names: a path that exists, else a model of the store. A Hub id the store
 * lacks is pulled into it when the user agrees on a terminal (`interactive`); otherwise, and for
 * any other unknown name, an error says what to run. `store` is the store's folder
 * ({@link modelsDir} unless given).
 */
export async function resolveModel(
  given: string,
  opts: {
    interactive?: boolean;
    ask?: (question: string) => boolean;
    pull?: Puller;
    store?: string;
  } = {},
): Promise<string> {
  const root = opts.store ?? modelsDir();
  if (existsSync(given)) {
    if (existsSync(join(given, "manifest.json"))) return given;
    const why = notAContainer(given);
    if (why) throw new Error(why);
    return given;
  }
  const stored = storeModels(root);
  const name = given.replace(/\.sluice$/, "");
  const hit = stored.get(name) ?? stored.get(name.replace(/@.*$/, ""));
  if (hit) return hit;
  if (HUB_ID.test(given)) {
    const out = storePath(given, root);
    const interactive = opts.interactive ?? (Deno.stdin.isTerminal() && Deno.stderr.isTerminal());
    if (!interactive) {
      throw new Error(
        `${given} is not in the model store (${root}): run \`sluice pull ${given}\` ` +
          "first (deno run -A mod.ts pull ...), or give a container's path",
      );
    }
    const ask = opts.ask ?? askTerminal;
    if (!ask(`${given} is not in ${root}. Pull it from the Hugging Face Hub and pack it?`)) {
      throw new Error(`${given}: not pulled`);
    }
    mkdirSync(dirname(out), { recursive: true });
    const pull = opts.pull ?? (await import("../pull/pull.ts")).pullModel;
    await pull(given, out);
    return out;
  }
  throw new Error(
    `${given}: no such file or folder, and no model of that name in ${root}` +
      `${didYouMean(name, [...stored.keys()])} (\`sluice list\` shows the store)`,
  );
}
