/**
 * The command line as a user runs it: JSON output matches llama2.c's known answer, bad input is
 * one clear line with exit code 1 (no stack trace), and --help documents the options.
 */
import assert from "node:assert/strict";
import { cpSync, readFileSync, writeFileSync } from "node:fs";
import { fixtureDir, hasFixture, packedFixture, runSluice, tempDir } from "./fixtures.ts";

const sluice = (...args: string[]) => runSluice(args);

Deno.test("generate --json reproduces the stories260k known answer", async () => {
  const known = JSON.parse(readFileSync(`${fixtureDir("stories260k")}/reference.json`, "utf8"));
  const model = await packedFixture("stories260k");
  const r = await sluice(
    "generate",
    "--model",
    model,
    "--prompt",
    known.prompt,
    "-n",
    "196",
    "--json",
  );
  assert.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  assert.deepEqual(out.prompt_ids, known.prompt_ids);
  assert.deepEqual(out.generated_ids, known.generated_ids);
  assert.equal(typeof out.text, "string");
  assert.ok(out.stats.generate_tok_s > 0 && out.stats.peak_rss_bytes > 0);
});

Deno.test("a budget under a MoE model's size streams experts and prints the same story", async () => {
  const model = await packedFixture("stories260k-moe64");
  const args = ["generate", "--model", model, "--prompt", "Once upon a time", "-n", "40", "--json"];
  const full = await sluice(...args);
  const tight = await sluice(...args, "--budget", "4M", "--lookahead", "4");
  assert.equal(tight.code, 0, tight.stderr);
  const a = JSON.parse(full.stdout), b = JSON.parse(tight.stdout);
  assert.deepEqual(b.generated_ids, a.generated_ids);
  assert.ok(b.stats.expert_misses > a.stats.expert_misses);
  assert.ok(b.stats.arena_bytes <= 4 * 2 ** 20);
  assert.ok(b.stats.lookahead_recall > 0);
});

Deno.test("bad input is one clear line and exit code 1", async () => {
  const missing = await sluice("generate", "--model", "/nonexistent/x.sluice", "--prompt", "hi");
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /sluice generate: .*\/nonexistent\/x\.sluice/);
  assert.doesNotMatch(missing.stderr, /^\s+at /m);
  const model = await packedFixture("stories260k-moe64");
  const small = await sluice("generate", "--model", model, "--budget", "1M", "--prompt", "hi");
  assert.equal(small.code, 1);
  assert.match(small.stderr, /below the floor of/);
  const unknown = await sluice("frobnicate");
  assert.equal(unknown.code, 2);
  assert.match(unknown.stderr, /unknown command "frobnicate"/);
});

Deno.test("--help documents the options", async () => {
  const r = await sluice("generate", "--help");
  assert.equal(r.code, 0);
  for (
    const flag of ["--model", "--budget", "--preset", "--cache", "--lookahead", "--json", "--seed"]
  ) {
    assert.ok(r.stdout.includes(flag), `--help lacks ${flag}`);
  }
  const plan = await sluice(
    "plan",
    "--model",
    await packedFixture("stories260k-moe64"),
    "--budget",
    "8M",
  );
  assert.equal(plan.code, 0, plan.stderr);
  assert.match(plan.stdout, /trunk\s+\d+\/5 layers pinned/);
  assert.match(plan.stdout, /floor/);
});

Deno.test("--verify stops at a corrupted expert record with a non-zero exit", async () => {
  const src = await packedFixture("stories260k-moe64");
  const path = `${tempDir()}/corrupt-cli.sluice`;
  cpSync(src, path, { recursive: true });
  const manifest = JSON.parse(readFileSync(`${path}/manifest.json`, "utf8"));
  const stride = manifest.experts[3].stride;
  const bank = `${path}/experts-L3.bin`;
  const bytes = readFileSync(bank);
  for (let e = 0; e < 64; e++) bytes[e * stride + 4000] ^= 0x5a;
  writeFileSync(bank, bytes);
  const r = await sluice(
    "generate",
    "--model",
    path,
    "--prompt",
    "Once upon a time",
    "-n",
    "20",
    "--verify",
    "--expert-slots",
    "8",
  );
  assert.equal(r.code, 1);
  assert.match(
    r.stderr,
    /expert \d+ of layer 3: checksum mismatch \(.*experts-L3\.bin offset \d+\)/,
  );
});

Deno.test({
  name: "generate --prompt-ids --json: Kimi K3's oracle prompt under a streaming budget",
  ignore: !hasFixture("tiny-kimi-k3-mxfp4") || !hasFixture("tiny-kimi-k3"),
  async fn() {
    const prompt = "203,34,2,239,195,71,163,54,121,104,16,16";
    const run = async (name: string, ...extra: string[]) => {
      const r = await sluice(
        "generate",
        "--model",
        await packedFixture(name),
        "--prompt-ids",
        prompt,
        "-n",
        "20",
        "--json",
        ...extra,
      );
      assert.equal(r.code, 0, r.stderr);
      return JSON.parse(r.stdout);
    };
    // kimi-k3-in-c's known continuation (../shared/models/README.md).
    const k3 = await run("tiny-kimi-k3");
    assert.deepEqual(k3.prompt_ids, prompt.split(",").map(Number));
    assert.deepEqual(
      k3.generated_ids,
      [219, 63, 4, 31, 48, 193, 57, 231, 219, 205, 145, 117, 79, 208, 18, 1, 74, 125, 66, 121],
    );
    const all = await run("tiny-kimi-k3-mxfp4");
    const streamed = await run("tiny-kimi-k3-mxfp4", "--expert-slots", "6", "--threads", "1");
    assert.deepEqual(streamed.generated_ids, all.generated_ids);
    assert.ok(streamed.stats.expert_misses > 0, "6 slots for 96 records must stream");
    assert.ok(streamed.stats.bytes_read > 0);
    const bad = await sluice(
      "generate",
      "--model",
      await packedFixture("tiny-kimi-k3"),
      "--prompt-ids",
      "1,256",
    );
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /--prompt-ids: token id 256 is outside the vocabulary of 256/);
  },
});

Deno.test("llama.cpp spellings and --prompt-ids give the known answer too", async () => {
  const known = JSON.parse(readFileSync(`${fixtureDir("stories260k")}/reference.json`, "utf8"));
  const model = await packedFixture("stories260k");
  const n = String(known.generated_ids.length);
  const llama = ["-m", model, "-p", known.prompt, "--n-predict", n, "--temp", "0", "-t", "1"];
  const short = await sluice("generate", ...llama, "--ctx-size", "256", "--json");
  assert.equal(short.code, 0, short.stderr);
  assert.deepEqual(JSON.parse(short.stdout).generated_ids, known.generated_ids);
  const byIds = ["-m", model, "--prompt-ids", known.prompt_ids.join(","), "-n", n, "-c", "256"];
  const ids = await sluice("generate", ...byIds, "--json");
  assert.equal(ids.code, 0, ids.stderr);
  const out = JSON.parse(ids.stdout);
  assert.deepEqual([out.prompt_ids, out.generated_ids], [known.prompt_ids, known.generated_ids]);
  const bad = await sluice("generate", "-m", model, "--prompt-ids", "1,99999", "-n", "1");
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /--prompt-ids: token id 99999 is outside the vocabulary of 512/);
  const kw = await sluice(
    "generate",
    "-m",
    model,
    "--chat",
    "-p",
    "hi",
    "--chat-template-kwargs",
    "{x",
  );
  assert.equal(kw.code, 1);
  assert.match(kw.stderr, /--chat-template-kwargs: not valid JSON/);
});

Deno.test("mod.ts --help lists every command, and each runs through the one dispatcher", async () => {
  const r = await sluice("--help");
  assert.equal(r.code, 0);
  for (const cmd of ["generate", "plan", "pack", "inspect", "split-banks"]) {
    assert.match(r.stdout, new RegExp(`^  ${cmd} `, "m"), `--help lacks ${cmd}`);
    const help = await sluice(cmd, "--help");
    assert.equal(help.code, 0, `${cmd} --help: ${help.stderr}`);
    assert.ok(help.stdout.includes(cmd), `${cmd} --help does not name the command`);
  }
  const inspect = await sluice("inspect", await packedFixture("stories260k"));
  assert.equal(inspect.code, 0, inspect.stderr);
  assert.match(inspect.stdout, /architecture\s+llama \(model_type llama\)/);
});
