/**
 * The worker that renders chat templates for engine/chat.ts, so a hostile template (a loop, an
 * exploding string) can be stopped: every evaluation step is counted against a budget, every
 * string and list it makes is checked against the output cap, and the caller terminates the
 * worker when the time budget runs out. Replies through the shared buffer of the job: Int32 slot
 * 0 is the state (1 rendering, 2 done, 3 failed), slot 1 the byte length of the UTF-8 text (the
 * output or the error message) that follows at byte 8.
 *
 * @module
 */
import { parentPort } from "node:worker_threads";
import { Environment, Interpreter, Template } from "@huggingface/jinja";

/** One render job. */
export interface RenderJob {
  sab: SharedArrayBuffer;
  template: string;
  /** Template variables (structured-cloneable). */
  vars: Record<string, unknown>;
  /** Most evaluation steps. */
  steps: number;
  /** Most bytes (UTF-8) of the output, and characters of any string or items of any list. */
  outputBytes: number;
}

/** Thrown by the patched interpreter when a budget runs out. */
class BudgetError extends Error {}

/**
 * The message of an error the template library threw. A TypeError is the library tripping over
 * a malformed template (its text, such as "reading 'type' of undefined", says nothing about the
 * template), so only its kind is kept.
 */
function reason(e: unknown): string {
  if (e instanceof TypeError) return "the template is malformed (the library failed on it)";
  // Jinja's "undefined" is a template variable that is not set: say so in plain words.
  return (e instanceof Error ? e.message : String(e)).replace(/\bundefined\b/g, "unset");
}

let steps = 0;
let maxSteps = 0;
let maxSize = 0;
/** Characters of all block outputs so far: a loop's output is the sum of its bodies'. */
let made = 0;
type Value = { value: unknown };
type Method = (this: unknown, a: unknown, env: unknown) => Value;
const proto = Interpreter.prototype as unknown as { evaluate: Method; evaluateBlock: Method };

function step(): void {
  if (++steps > maxSteps) {
    throw new BudgetError(`took more than ${maxSteps} steps (a loop in the template?)`);
  }
}

function checkSize(x: unknown): void {
  if ((typeof x === "string" || Array.isArray(x)) && x.length > maxSize) {
    throw new BudgetError(
      `made a ${typeof x === "string" ? "string" : "list"} of ${x.length} items, more than the ` +
        `cap of ${maxSize}`,
    );
  }
}

const evaluate = proto.evaluate;
proto.evaluate = function (s, env) {
  step();
  const v = evaluate.call(this, s, env);
  checkSize(v?.value);
  return v;
};
// Loop bodies run through evaluateBlock, which an empty body never leaves: count it too.
const evaluateBlock = proto.evaluateBlock;
proto.evaluateBlock = function (s, env) {
  step();
  const v = evaluateBlock.call(this, s, env);
  made += (v.value as string).length;
  if (made > 8 * maxSize) {
    throw new BudgetError(`produced more than ${8 * maxSize} characters in all (a loop?)`);
  }
  return v;
};

/** Most items of a `range()`: chat templates loop over messages, never over millions. */
const RANGE_CAP = 100_000;

/** `range` as the library has it, refusing a list above {@link RANGE_CAP} before making it. */
function range(start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) [start, stop] = [0, start];
  if (step === 0) throw new Error("range() step must not be zero");
  const n = Math.max(0, Math.ceil((stop - start) / step));
  if (n > RANGE_CAP) {
    throw new BudgetError(`range() of ${n} items, more than the cap of ${RANGE_CAP}`);
  }
  return Array.from({ length: n }, (_, i) => start + i * step);
}

// The library's globals include an unbounded `range`: every environment gets the bounded one.
const envProto = Environment.prototype as unknown as {
  set(this: unknown, name: string, value: unknown): unknown;
};
const set = envProto.set;
envProto.set = function (name, value) {
  return set.call(this, name, name === "range" && typeof value === "function" ? range : value);
};

let cached: { source: string; template: Template } | null = null;
const enc = new TextEncoder();

function reply(sab: SharedArrayBuffer, state: number, text: string): void {
  const head = new Int32Array(sab, 0, 2);
  const body = new Uint8Array(sab, 8);
  const { written } = enc.encodeInto(text, body);
  head[1] = written;
  Atomics.store(head, 0, state);
  Atomics.notify(head, 0);
}

parentPort!.on("message", (job: RenderJob) => {
  const head = new Int32Array(job.sab, 0, 2);
  Atomics.store(head, 0, 1);
  Atomics.notify(head, 0);
  steps = 0;
  made = 0;
  maxSteps = job.steps;
  maxSize = job.outputBytes;
  try {
    if (cached?.source !== job.template) {
      try {
        cached = { source: job.template, template: new Template(job.template) };
      } catch (e) {
        throw new Error(`does not parse: ${reason(e)}`);
      }
    }
    const text = cached.template.render(job.vars);
    if (enc.encode(text).length > job.outputBytes) {
      throw new BudgetError(`its output is longer than the cap of ${job.outputBytes} bytes`);
    }
    reply(job.sab, 2, text);
  } catch (e) {
    reply(job.sab, 3, reason(e));
  }
});
