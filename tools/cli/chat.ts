/**
 * `mod.ts chat`: an interactive multi-turn chat in the terminal. Each turn renders the whole
 * conversation through the chat template, and the session's prompt cache means only the new
 * tokens run. Slash commands reset, report, save and load the conversation (KV cache included).
 *
 * @module
 */
import { type ChatMessage, checkChatMessages } from "../../engine/chat.ts";
import type { GenerateOptions } from "../../engine/session.ts";
import { loadSession, saveSession } from "../../engine/session_state.ts";
import { formatStats } from "../../engine/stats.ts";
import {
  COLOR_FLAGS,
  COLOR_HELP,
  colorOn,
  contextFullNotice,
  loadLine,
  paint,
  prefillProgress,
} from "./feedback.ts";
import { HELP_FLAG, helpShown, MODEL_FLAG, parseCommandArgs } from "./args.ts";
import {
  applyChatTemplate,
  CHAT_TEMPLATE_FLAG,
  CHAT_TEMPLATE_HELP,
  openSession,
  RUN_FLAGS,
  RUN_HELP,
  runOptionsFromArgs,
  SAMPLING_FLAGS,
  SAMPLING_HELP,
  samplingFromArgs,
} from "./run_flags.ts";
import { SPEC_FLAGS, SPEC_HELP, specFromArgs } from "./spec_flags.ts";

const HELP = `sluice chat — talk to a model, turn after turn, keeping its KV cache

Usage:
  deno run -A mod.ts chat --model X.sluice [--system TEXT] [--prompt "first message"]

Commands inside the chat:
  /reset           forget the conversation (and the cached state)
  /stats           the stats block of the last turn, and how full the context is
  /save FILE       save the conversation with its KV cache to a new file; /load resumes it
                   exactly (/save! FILE replaces an older session file, nothing else)
  /load FILE       load a saved conversation (it must come from the same container)
  /system TEXT     set the system message (empty: none)
  /exit            leave (also Ctrl-D, or Ctrl-C twice at the prompt)
  Ctrl-C           stop the answer being written; the conversation is kept

Chat:
  -m, --model PATH      container made by 'mod.ts pack' (default: the synthetic demo model)
  --system TEXT         system message (also -sys, --system-prompt)
  -p, --prompt TEXT     first user message (then the chat continues on stdin)
${CHAT_TEMPLATE_HELP}

Sampling (greedy by default; each turn is seeded from --seed and its turn number, so a loaded
session samples what the original would have):
${SAMPLING_HELP}

Speculative decoding:
${SPEC_HELP}

Memory and I/O (none of these change the output):
${RUN_HELP}

  --quiet               no load line, prompt progress or per-turn stats line
${COLOR_HELP}
  -h, --help            this text
`;

/** What a saved chat keeps beside the KV cache. */
interface ChatState {
  kind: "sluice-chat";
  system: string | null;
  messages: ChatMessage[];
  turn: number;
  sampling: GenerateOptions;
}

/** Lines of a byte stream, without their line ends. */
async function* lines(input: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  let buf = "";
  for await (const chunk of input.pipeThrough(new TextDecoderStream())) {
    buf += chunk;
    for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
      yield buf.slice(0, i).replace(/\r$/, "");
      buf = buf.slice(i + 1);
    }
  }
  if (buf) yield buf;
}

/** Runs the chat command; returns the exit code. */
export async function chatCommand(args: string[]): Promise<number> {
  const a = parseCommandArgs("chat", args, {
    ...MODEL_FLAG,
    system: { type: "string", dashed: ["sys"], aliases: ["system-prompt"] },
    prompt: { type: "string", short: "p" },
    ...SAMPLING_FLAGS,
    ...RUN_FLAGS,
    ...SPEC_FLAGS,
    ...CHAT_TEMPLATE_FLAG,
    quiet: { type: "boolean" },
    ...COLOR_FLAGS,
    ...HELP_FLAG,
  });
  if (helpShown(a, HELP)) return 0;
  const quiet = a.bool("quiet");
  const tty = Deno.stdin.isTerminal();
  const colorErr = colorOn(a, Deno.stderr);
  const session = await openSession(a, { ...runOptionsFromArgs(a), spec: specFromArgs(a) }, quiet);
  if (!quiet) console.error(paint(colorErr, "dim", loadLine(session.stats())));
  try {
    // A template that does not render is refused now, not at every line; a checkpoint without
    // one chats through the built-in template, with a notice.
    applyChatTemplate(session, a, "chat", quiet);
    session.chatIds([{ role: "user", content: "" }]);
  } catch (e) {
    session.close();
    throw e;
  }
  const sampling = samplingFromArgs(a);
  // A drawn seed is kept in the state, so a saved session samples on as the original would.
  sampling.seed ??= crypto.getRandomValues(new Uint32Array(1))[0];
  let state: ChatState = {
    kind: "sluice-chat",
    system: a.str("system") ?? null,
    messages: [],
    turn: 0,
    sampling,
  };
  const enc = new TextEncoder();
  const out = (s: string) => Deno.stdout.writeSync(enc.encode(s));
  const note = (s: string) => console.error(s);
  // Ctrl-C stops the answer being written (at the next token or prompt chunk) and keeps the
  // conversation; at the prompt, a first Ctrl-C only says how to leave and a second one leaves.
  let current: AbortController | null = null;
  let armed = false;
  const onInterrupt = () => {
    if (current) current.abort();
    else if (!tty || armed) Deno.exit(130);
    else {
      armed = true;
      out("\n(Ctrl-C again, /exit or Ctrl-D to leave)\n> ");
    }
  };
  Deno.addSignalListener("SIGINT", onInterrupt);
  // The forward passes run on this thread: without a turn of the event loop now and then, the
  // signal would wait for the whole answer. Every 20 ms costs nothing next to a token.
  let breathed = performance.now();
  const breathe = async () => {
    if (performance.now() - breathed < 20) return;
    await new Promise((r) => setTimeout(r, 0));
    breathed = performance.now();
  };

  const turn = async (text: string) => {
    const messages = [...state.messages, { role: "user", content: text }];
    const all = state.system ? [{ role: "system", content: state.system }, ...messages] : messages;
    const ids = session.chatIds(all);
    if (ids.length >= session.model.maxContext) {
      throw new Error(
        `the conversation has ${ids.length} tokens; the context holds ` +
          `${session.model.maxContext}: /reset, or start with a larger --ctx`,
      );
    }
    const abort = new AbortController();
    current = abort;
    let answer = "";
    try {
      const seed = (state.sampling.seed! + state.turn) >>> 0;
      const onPrefill = quiet ? breathe : prefillProgress({
        color: colorErr,
        cached: () => session.timings.cachedTokens,
      }, breathe);
      const opts = { ...state.sampling, seed, signal: abort.signal, onPrefill };
      for await (const tok of session.generate(ids, opts)) {
        answer += tok.text;
        out(tok.text);
        await breathe();
      }
    } finally {
      current = null;
    }
    out("\n");
    if (abort.signal.aborted) note("(stopped; the answer so far is kept)");
    const full = contextFullNotice(session.stats(), session.model.maxContext);
    if (full) note(paint(colorErr, "yellow", `${full.slice(0, -1)}, or /reset)`));
    state.messages = [...messages, { role: "assistant", content: answer }];
    state.turn++;
    if (!quiet) {
      const t = session.timings;
      const rate = t.generateMs > 0 ? (1000 * t.generatedTokens) / t.generateMs : 0;
      note(
        `[${t.generatedTokens} tokens, ${rate.toFixed(1)} tok/s; prompt ${t.promptTokens} ` +
          `(${t.cachedTokens} cached); context ${session.cachedTokens.length}/` +
          `${session.model.maxContext}]`,
      );
    }
  };

  const command = (line: string): boolean => {
    const [name, ...rest] = line.split(" ");
    const arg = rest.join(" ").trim();
    switch (name) {
      case "/exit":
      case "/quit":
        return false;
      case "/reset":
        state = { ...state, messages: [], turn: 0 };
        session.resetCache();
        note("(conversation cleared)");
        break;
      case "/stats":
        note(formatStats(session.stats()));
        note(
          `context       ${session.cachedTokens.length}/${session.model.maxContext} tokens ` +
            `cached, ${state.turn} turn(s)`,
        );
        break;
      case "/save":
      case "/save!": {
        if (!arg) throw new Error("/save needs a file name");
        const bytes = saveSession(session, arg, state, name === "/save!");
        note(
          `(saved ${state.turn} turn(s), ${session.cachedTokens.length} tokens, ${bytes} bytes)`,
        );
        break;
      }
      case "/load": {
        if (!arg) throw new Error("/load needs a file name");
        const saved = loadSession(session, arg).app as ChatState | null;
        if (saved?.kind !== "sluice-chat" || !Array.isArray(saved.messages)) {
          session.resetCache();
          throw new Error(`${arg}: not a saved chat (no conversation in it); the chat was cleared`);
        }
        try {
          checkChatMessages(saved.messages, session.model.maxContext, `${arg}: the conversation`);
        } catch (e) {
          session.resetCache();
          throw new Error(`${(e as Error).message}; the chat was cleared`);
        }
        state = saved;
        note(`(loaded ${state.turn} turn(s), ${session.cachedTokens.length} tokens from ${arg})`);
        break;
      }
      case "/system":
        state = { ...state, system: arg || null };
        note(arg ? "(system message set)" : "(system message cleared)");
        break;
      case "/help":
        note(HELP.slice(HELP.indexOf("Commands"), HELP.indexOf("Chat:")).trimEnd());
        break;
      default:
        throw new Error(`unknown command ${name} (try /help)`);
    }
    return true;
  };

  try {
    if (tty) note("sluice chat — /help for commands, /exit or Ctrl-D to leave");
    const first = a.str("prompt");
    if (first !== undefined) await turn(first);
    if (tty) out("> ");
    for await (const raw of lines(Deno.stdin.readable)) {
      armed = false;
      const line = raw.trim();
      try {
        if (line.startsWith("/")) {
          if (!command(line)) break;
        } else if (line) {
          await turn(line);
        }
      } catch (e) {
        note(`sluice chat: ${(e as Error).message}`);
      }
      if (tty) out("> ");
    }
  } finally {
    Deno.removeSignalListener("SIGINT", onInterrupt);
    session.close();
  }
  return 0;
}
