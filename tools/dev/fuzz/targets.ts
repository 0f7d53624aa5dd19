/**
 * What `deno task fuzz` feeds: one target per parser of untrusted input — the safetensors
 * header, config.json (+ generation_config.json), manifest.json, expert record headers, the
 * tokenizer files, the pack journal, the generate command line, the server's request bodies,
 * chat templates and saved session files (./serve_target.ts). Each target has seed inputs (real files from ../shared/models where it
 * needs them, packed into a scratch folder) and runs one input through the same code a user's
 * file goes through.
 *
 * @module
 */
import { closeSync, existsSync, openSync } from "node:fs";
import { join } from "node:path";
import { loadModelConfig, normalizeConfig } from "../../../engine/config.ts";
import { openContainer, parseManifest } from "../../../engine/container.ts";
import { loadTokenizer, parseTiktokenRanks } from "../../../engine/tokenizer.ts";
import { crc32 } from "../../../io/crc32.ts";
import { decodeRecordHeader, RECORD_HEADER_BYTES } from "../../../io/format.ts";
import { checkRecord } from "../../../io/record_check.ts";
import { openCheckpoint, readSafetensorsHeader } from "../../../io/safetensors.ts";
import { parseGenerateArgs } from "../../cli/generate.ts";
import { packCheckpoint } from "../../pack.ts";
import { dropDamagedWork, JOURNAL, openJournal } from "../../pack/journal.ts";
import { computeLayout } from "../../pack/layout.ts";
import { mutate, type Rng } from "./mutate.ts";
import { serveTarget, serveTemplateTarget, sessionFileTarget } from "./serve_target.ts";

/** One parser under fuzz. */
export interface FuzzTarget {
  name: string;
  seeds: Uint8Array[];
  /** Feeds one input; a thrown `Error` (not a TypeError, RangeError...) is a clean rejection. */
  run(input: Uint8Array): unknown;
  /** A structure-aware mutation (default: {@link mutate}). */
  mutate?(rng: Rng, seeds: Uint8Array[]): Uint8Array;
  /** Releases what the target holds open (the server target's server and session). */
  close?(): Promise<void>;
  /** Time one input may take before it is a hang (default: the fuzzer's second). */
  hangMs?: number;
}

const enc = new TextEncoder();
const dec = new TextDecoder();
const QUIET = { progress: "off" as const, log: () => {} };

function fixture(shared: string, name: string, file = ""): string {
  return join(shared, name, file);
}

/** JSON text of `input`, or a clean rejection when it is not JSON (as the file readers do). */
function json(input: Uint8Array): unknown {
  try {
    return JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(input));
  } catch (e) {
    throw new Error(`not JSON (${(e as Error).message})`);
  }
}

function safetensorsTarget(work: string, shared: string | null): FuzzTarget {
  const tiny = enc.encode(JSON.stringify({
    __metadata__: { format: "pt" },
    "a.weight": { dtype: "F32", shape: [2, 3], data_offsets: [0, 24] },
    "b.weight": { dtype: "BF16", shape: [4], data_offsets: [24, 32] },
    "c": { dtype: "F8_E4M3", shape: [1, 1, 8], data_offsets: [32, 40] },
  }));
  const seeds = [tiny];
  if (shared) {
    for (const name of ["stories260k-moe", "tiny-deepseek-v3"]) {
      const bytes = Deno.readFileSync(fixture(shared, name, "model.safetensors"));
      const len = Number(new DataView(bytes.buffer).getBigUint64(0, true));
      seeds.push(bytes.slice(8, 8 + len));
    }
  }
  const path = join(work, "fuzz.safetensors");
  return {
    name: "safetensors header",
    seeds,
    run(input) {
      // The 8-byte length is the input's own most of the time, sometimes a lie.
      const f = Deno.openSync(path, { write: true, create: true, truncate: true });
      try {
        const len = new Uint8Array(8);
        const lie = input.length > 0 ? input[0] % 16 === 0 : false;
        new DataView(len.buffer).setBigUint64(
          0,
          BigInt(lie ? input.length * 2 + input[input.length - 1] : input.length),
          true,
        );
        f.writeSync(len);
        f.writeSync(input);
        // A sparse data area as large as the real checkpoints' (1.2 MB): offsets can point in.
        f.truncateSync(8 + input.length + 1_300_000);
      } finally {
        f.close();
      }
      return readSafetensorsHeader(path);
    },
  };
}

function configTarget(shared: string): FuzzTarget {
  const seeds: Uint8Array[] = [];
  for (
    const name of ["stories260k", "stories260k-moe", "stories260k-qwen3moe", "tiny-deepseek-v3"]
  ) {
    seeds.push(Deno.readFileSync(fixture(shared, name, "config.json")));
  }
  const gen = json(Deno.readFileSync(fixture(shared, "stories260k", "generation_config.json")));
  let n = 0;
  return {
    name: "config.json",
    seeds,
    run(input) {
      // Every third input is a generation_config.json against a valid config.
      if (n++ % 3 === 2) return normalizeConfig(json(seeds[n % seeds.length]), json(input));
      return normalizeConfig(json(input), gen);
    },
  };
}

async function packed(work: string, shared: string, name: string): Promise<string> {
  const out = join(work, `${name}.sluice`);
  if (!existsSync(join(out, "manifest.json"))) {
    await packCheckpoint(fixture(shared, name), out, QUIET);
  }
  return out;
}

async function manifestTarget(work: string, shared: string): Promise<FuzzTarget> {
  const dirs = [
    await packed(work, shared, "stories260k-moe"),
    await packed(work, shared, "tiny-deepseek-v3"),
  ];
  const seeds = dirs.map((d) => Deno.readFileSync(join(d, "manifest.json")));
  let n = 0;
  return {
    name: "manifest.json",
    seeds,
    run(input) {
      return parseManifest(json(input), dirs[n++ % dirs.length]);
    },
  };
}

async function recordTarget(work: string, shared: string): Promise<FuzzTarget> {
  const c = openContainer(await packed(work, shared, "stories260k-moe"));
  const bank = c.manifest.experts[1]!;
  const file = c.expertBankPath(1);
  const all = Deno.readFileSync(file);
  const seeds = [0, 3, 7].map((e) =>
    all.slice(e * bank.stride, e * bank.stride + RECORD_HEADER_BYTES)
  );
  const record = all.slice(0, bank.stride);
  return {
    name: "record header",
    seeds,
    run(input) {
      const place = { file, layer: 1, expert: 0, offset: 0 };
      decodeRecordHeader(input, place, bank.stride);
      const r = record.slice();
      r.set(input.subarray(0, Math.min(input.length, r.length)));
      checkRecord(r, bank, 1, 0, file, 0, true);
    },
    mutate(rng, s) {
      const x = mutate(rng, s);
      // Half the time the header CRC is made right, so the fields behind it get exercised.
      if (rng.below(2) && x.length >= RECORD_HEADER_BYTES) {
        const v = new DataView(x.buffer, x.byteOffset, RECORD_HEADER_BYTES);
        v.setUint32(RECORD_HEADER_BYTES - 4, crc32(x.subarray(0, RECORD_HEADER_BYTES - 4)), true);
      }
      return x;
    },
  };
}

function tokenizerTarget(work: string, shared: string): FuzzTarget {
  const dir = join(work, "tokenizer");
  Deno.mkdirSync(dir, { recursive: true });
  for (const f of ["tokenizer_config.json", "special_tokens_map.json", "config.json"]) {
    Deno.copyFileSync(fixture(shared, "stories260k", f), join(dir, f));
  }
  const tiktoken = enc.encode(["IQ== 0", "Ig== 1", "aGVsbG8= 2", "IHdvcmxk 3"].join("\n"));
  const seeds = [Deno.readFileSync(fixture(shared, "stories260k", "tokenizer.json")), tiktoken];
  let n = 0;
  return {
    name: "tokenizer files",
    seeds,
    async run(input) {
      if (n++ % 4 === 3) return parseTiktokenRanks(dec.decode(input), "tiktoken.model");
      Deno.writeFileSync(join(dir, "tokenizer.json"), input);
      const tok = await loadTokenizer(dir);
      const ids = tok.encode('Once upon a time, Tim said: "héllo 😀"');
      return tok.decode(ids);
    },
  };
}

async function journalTarget(work: string, shared: string): Promise<FuzzTarget> {
  const src = fixture(shared, "stories260k-moe");
  const out = join(work, "journal.sluice");
  const tmp = out + ".tmp";
  if (!existsSync(join(tmp, JOURNAL))) {
    await packCheckpoint(src, out, { ...QUIET, stopAfterLayer: 2 }).catch(() => {});
  }
  const seed = Deno.readFileSync(join(tmp, JOURNAL));
  const trunk = Deno.readFileSync(join(tmp, "trunk.bin"));
  const j = json(seed) as { fingerprint: string; convert: null; options: string };
  const key = { fingerprint: j.fingerprint, convert: j.convert, options: j.options };
  const cfg = loadModelConfig(src);
  const ckpt = openCheckpoint(src);
  const layout = computeLayout(cfg, ckpt, {});
  ckpt.close();
  return {
    name: "pack journal",
    seeds: [seed],
    run(input) {
      // A journal that does not match starts the pack over (empties the folder): put it back.
      if (!existsSync(join(tmp, "trunk.bin"))) Deno.writeFileSync(join(tmp, "trunk.bin"), trunk);
      Deno.writeFileSync(join(tmp, JOURNAL), input);
      const journal = openJournal(tmp, key, () => {});
      const fd = openSync(join(tmp, "trunk.bin"), "r");
      try {
        dropDamagedWork(journal, layout, tmp, fd, -1, 1 << 16);
      } finally {
        closeSync(fd);
      }
      return journal;
    },
  };
}

function cliTarget(): FuzzTarget {
  const lines = [
    [
      "--model",
      "x.sluice",
      "--prompt",
      "Once",
      "-n",
      "20",
      "--temperature",
      "0.7",
      "--top-p",
      "0.9",
    ],
    ["--prompt", "hi", "--threads", "2", "--prefill-chunk", "32", "--ctx", "512", "--budget", "1G"],
    [
      "--preset",
      "laptop",
      "--top-k",
      "40",
      "--min-p",
      "0.05",
      "--repeat-penalty",
      "1.1",
      "--seed",
      "7",
    ],
    [
      "--cache",
      "lru",
      "--ring-slots",
      "3",
      "--expert-slots",
      "9",
      "--lookahead",
      "2",
      "--io",
      "buffered",
    ],
    ["--verify", "--crc-sample", "0.5", "--trace", "/tmp/t.jsonl", "--json", "--quiet", "--chat"],
    ["--no-readahead", "--readahead-depth", "3", "--shards", "a,b", "--learn", "--no-hot-list"],
  ];
  return {
    name: "generate arguments",
    seeds: lines.map((l) => enc.encode(l.join("\0"))),
    run(input) {
      return parseGenerateArgs(dec.decode(input).split("\0"));
    },
  };
}

/** The targets that can run: those needing ../shared/models are left out (named) without it. */
export async function makeTargets(
  work: string,
  shared: string | null,
): Promise<{ targets: FuzzTarget[]; skipped: string[] }> {
  const targets = [
    safetensorsTarget(work, shared),
    cliTarget(),
    await serveTarget(),
    await serveTemplateTarget(work),
    await sessionFileTarget(work),
  ];
  const needShared = [
    "config.json",
    "manifest.json",
    "record header",
    "tokenizer files",
    "pack journal",
  ];
  if (!shared) return { targets, skipped: needShared };
  targets.push(
    configTarget(shared),
    await manifestTarget(work, shared),
    await recordTarget(work, shared),
    tokenizerTarget(work, shared),
    await journalTarget(work, shared),
  );
  return { targets, skipped: [] };
}
