/**
 * Structured output through XGrammar's WebAssembly build (`@mlc-ai/web-xgrammar`): a JSON schema,
 * free JSON or a structural tag (the tool-call formats) compiled against the model's vocabulary,
 * then a matcher per generation that masks the logits of every token the grammar does not allow.
 *
 * The package is a UMD bundle whose Node path reads the CommonJS globals `require` and
 * `__filename` while it loads; Deno has neither in an ES module, so they are lent for the import
 * and taken back (docs/LEARNED.md).
 *
 * @module
 */
import { createRequire } from "node:module";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { CompiledGrammar, GrammarCompiler, StructuralTagFormat } from "@mlc-ai/web-xgrammar";
import type { Session, TokenConstraint } from "../../engine/session.ts";
import { parseTiktokenRanks, type Tokenizer } from "../../engine/tokenizer.ts";
import { readJsonObject } from "../../io/json_file.ts";

/** The XGrammar module. */
export type XGrammar = typeof import("@mlc-ai/web-xgrammar");

let loading: Promise<XGrammar> | null = null;

/** Lines the WebAssembly runtime printed to stderr while {@link caught} ran, else null. */
let stderrLines: string[] | null = null;

/** Loads the XGrammar module once. */
export function loadXGrammar(): Promise<XGrammar> {
  loading ??= (async () => {
    const g = globalThis as Record<string, unknown>;
    const lent = { require: createRequire(import.meta.url), __filename: "xgrammar.js" };
    const had = Object.keys(lent).filter((k) => k in g);
    if (had.length > 0) throw new Error(`xgrammar: the global ${had[0]} is already defined`);
    Object.assign(g, lent);
    // The runtime binds console.error when it starts; binding this wrapper instead lets a failed
    // compile's reason ("[FATAL] …: properties must be an object") reach the client's 400.
    const consoleError = console.error;
    console.error = (...args: unknown[]) => {
      if (stderrLines) stderrLines.push(args.join(" "));
      else consoleError.apply(console, args);
    };
    try {
      await import("@mlc-ai/web-xgrammar");
      const mod = g.xgrammar as XGrammar | undefined;
      if (!mod) throw new Error("xgrammar: the module did not load");
      // The WebAssembly runtime starts on first use; start it while the globals are still lent.
      await mod.Grammar.builtinJSONGrammar();
      return mod;
    } finally {
      console.error = consoleError;
      for (const k of [...Object.keys(lent), "xgrammar"]) delete g[k];
    }
  })();
  return loading;
}

/**
 * Runs `f`, turning a failure into an Error whose message is what the runtime printed (its C++
 * checks abort with a line on stderr and throw a bare value).
 */
async function caught<T>(f: () => Promise<T>): Promise<T> {
  stderrLines = [];
  try {
    return await f();
  } catch (e) {
    const said = stderrLines.map((l) => l.replace(/^\[FATAL\] \S+: /, "")).filter((l) =>
      l !== "Aborted()"
    );
    const why = said.join("; ") || (e instanceof Error ? e.message : "") || String(e);
    throw new Error(why);
  } finally {
    stderrLines = null;
  }
}

/** What a request constrains its output to. */
export type OutputGrammar =
  | { kind: "json" }
  | { kind: "schema"; schema: Record<string, unknown> }
  | { kind: "tag"; format: StructuralTagFormat };

/** A session's grammar compiler (its vocabulary indexed once). */
interface Indexed {
  compiler: GrammarCompiler;
  xg: XGrammar;
}

const compilers = new WeakMap<Session, Promise<Indexed>>();

/** GPT-2's byte-level alphabet: the printable character each byte is written as. */
const BYTE_CHARS: readonly string[] = (() => {
  const printable = (b: number) =>
    (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const out: string[] = [];
  let next = 256;
  for (let b = 0; b < 256; b++) out.push(String.fromCodePoint(printable(b) ? b : next++));
  return out;
})();

const utf8 = new TextEncoder();

/** Bytes in the byte-level alphabet (XGrammar's "byte_level" vocabulary type). */
function byteLevel(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += BYTE_CHARS[b];
  return s;
}

/** A SentencePiece-style piece (`▁` for a space, `<0xNN>` for a byte) in the byte-level alphabet. */
function pieceBytes(piece: string): string {
  const byte = /^<0x([0-9A-Fa-f]{2})>$/.exec(piece);
  if (byte) return BYTE_CHARS[parseInt(byte[1], 16)];
  return byteLevel(utf8.encode(piece.replaceAll("\u2581", " ")));
}

/** The decoder types of a tokenizer.json (a Sequence's members, or the one). */
function decoderTypes(json: Record<string, unknown>): string[] {
  const d = json.decoder as { type?: string; decoders?: { type?: string }[] } | null | undefined;
  return [d?.type ?? "", ...(d?.decoders ?? []).map((x) => x.type ?? "")];
}

/**
 * The bytes of every token id (of `vocabSize`, the logits' length) in the byte-level alphabet,
 * as XGrammar needs them, read from the checkpoint's own vocabulary in `dir` so that a token
 * holding part of a UTF-8 character still counts as its bytes (a grammar may need them to spell
 * "｜" or "ü"): tokenizer.json's byte-level keys as they are, SentencePiece pieces converted,
 * tiktoken's ranks decoded. Special tokens are "": XGrammar never allows them inside the output
 * (the stop ids are given apart). Other tokenizers fall back to each id's decoded text.
 */
export function vocabularyTexts(dir: string, tok: Tokenizer, vocabSize: number): string[] {
  const out = new Array<string>(vocabSize).fill("");
  const jsonPath = join(dir, "tokenizer.json");
  const tiktoken = join(dir, "tiktoken.model");
  if (existsSync(jsonPath)) {
    const json = readJsonObject(jsonPath);
    const model = json.model as { type?: string; vocab?: Record<string, number> } | undefined;
    const types = decoderTypes(json);
    const convert = types.includes("ByteLevel")
      ? (k: string) => k
      : types.includes("ByteFallback") || types.includes("Metaspace")
      ? pieceBytes
      : null;
    if (convert && model?.type === "BPE" && model.vocab) {
      for (const [k, id] of Object.entries(model.vocab)) {
        if (Number.isInteger(id) && id >= 0 && id < vocabSize) out[id] = convert(k);
      }
      const added = (json.added_tokens ?? []) as {
        id: number;
        content: string;
        special?: boolean;
      }[];
      for (const t of added) {
        if (t.id >= 0 && t.id < vocabSize) {
          out[t.id] = t.special ? "" : byteLevel(utf8.encode(t.content));
        }
      }
      return out;
    }
  } else if (existsSync(tiktoken)) {
    for (const [b64, rank] of parseTiktokenRanks(readFileSync(tiktoken, "utf8"), tiktoken)) {
      if (rank < vocabSize) {
        out[rank] = byteLevel(Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)));
      }
    }
    return out;
  }
  const anchor = tok.encode("a", { addSpecial: false })[0] ?? 0;
  const base = tok.decode([anchor], { skipSpecial: true });
  for (let id = 0; id < Math.min(vocabSize, tok.vocabSize); id++) {
    const text = tok.decode([anchor, id], { skipSpecial: true });
    out[id] = byteLevel(utf8.encode(text.startsWith(base) ? text.slice(base.length) : ""));
  }
  return out;
}

function indexed(session: Session): Promise<Indexed> {
  let p = compilers.get(session);
  if (!p) {
    p = (async () => {
      const xg = await loadXGrammar();
      const info = await xg.TokenizerInfo.createTokenizerInfo(
        vocabularyTexts(
          session.model.container.dir,
          session.tokenizer,
          session.model.cfg.vocabSize,
        ),
        "byte_level",
        false,
        session.model.cfg.vocabSize,
        [...session.stopIds()],
      );
      const compiler = await xg.GrammarCompiler.createGrammarCompiler(info);
      return { compiler, xg };
    })();
    // A failure is not kept: the next request tries again.
    p.catch(() => compilers.delete(session));
    compilers.set(session, p);
  }
  return p;
}

/** Compiles `grammar` for `session`; throws the grammar engine's message on a bad schema. */
export async function compileGrammar(
  session: Session,
  grammar: OutputGrammar,
): Promise<CompiledGrammar> {
  const { compiler, xg } = await indexed(session);
  return await caught(async () => {
    switch (grammar.kind) {
      case "json":
        return await compiler.compileBuiltinJSONGrammar();
      case "schema":
        return await compiler.compileGrammar(await schemaGrammar(xg, grammar.schema));
      case "tag":
        return await compiler.compileStructuralTag({
          type: "structural_tag",
          format: await compactJson(xg, grammar.format),
        });
    }
  });
}

/**
 * The grammar of a JSON schema with compact separators and no free whitespace: a model (a
 * random-weight one above all) cannot pad the output with whitespace until it runs out of tokens.
 */
function schemaGrammar(xg: XGrammar, schema: unknown) {
  // -1 asks for no indentation (undefined would mean the default, 2).
  return xg.Grammar.fromJSONSchema(JSON.stringify(schema), false, -1, [", ", ": "], true);
}

/** A structural tag with each JSON schema element replaced by its compact grammar. */
async function compactJson(xg: XGrammar, f: StructuralTagFormat): Promise<StructuralTagFormat> {
  switch (f.type) {
    case "json_schema":
      return { type: "grammar", grammar: (await schemaGrammar(xg, f.json_schema)).toString() };
    case "sequence":
    case "or":
      return { ...f, elements: await Promise.all(f.elements.map((e) => compactJson(xg, e))) };
    case "tag":
      return { ...f, content: await compactJson(xg, f.content) };
    default:
      return f;
  }
}

/** Per-generation mask timing, for the live view and the benchmark. */
export interface MaskStats {
  steps: number;
  ms: number;
}

/** Sets the logits of the ids whose bit is clear in XGrammar's `bits` to −Infinity. */
export function applyBitmask(bits: Int32Array, logits: Float32Array): void {
  for (let w = 0; w < bits.length; w++) {
    const word = bits[w];
    if (word === -1) continue;
    const end = Math.min(logits.length, (w + 1) * 32);
    for (let id = w * 32; id < end; id++) {
      if (((word >>> (id & 31)) & 1) === 0) logits[id] = -Infinity;
    }
  }
  // Ids past the grammar's vocabulary (padding rows of the head) are never allowed.
  for (let id = bits.length * 32; id < logits.length; id++) logits[id] = -Infinity;
}

/** A fresh matcher for one generation, as the engine's per-step constraint. */
export async function grammarConstraint(
  session: Session,
  compiled: CompiledGrammar,
  stats: MaskStats = { steps: 0, ms: 0 },
): Promise<TokenConstraint & { dispose(): void }> {
  const { xg } = await indexed(session);
  const matcher = await xg.GrammarMatcher.createGrammarMatcher(compiled);
  return {
    async mask(logits) {
      const t0 = performance.now();
      const bits = await matcher.getNextTokenBitmask();
      if (!bits.some((w) => w !== 0)) {
        throw new Error(
          "grammar: no token of this vocabulary can continue the output here (the schema or " +
            "tool-call format needs text this tokenizer cannot write)",
        );
      }
      applyBitmask(bits, logits);
      stats.steps++;
      stats.ms += performance.now() - t0;
    },
    accept(id) {
      if (!matcher.acceptToken(id)) {
        throw new Error(`grammar: token ${id} was sampled but the grammar does not allow it`);
      }
      return !matcher.isTerminated();
    },
    dispose: () => matcher.dispose(),
  };
}
