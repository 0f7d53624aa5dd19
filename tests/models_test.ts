/**
 * Models by name: the store `pull` writes into and `list` shows (size, architecture, format,
 * floor), `-m NAME` resolving there, `-m org/repo` offering a pull on a terminal and refusing
 * clearly otherwise, and a checkpoint folder or a GGUF file given to `-m` answered with what to
 * run instead.
 */
import assert from "node:assert/strict";
import { cpSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { resolveModel, storePath } from "../tools/cli/models.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { synthCheckpoint } from "../tools/synth.ts";
import { tempDir } from "./fixtures.ts";

/** `mod.ts args` with the model store at `store`. */
async function sluice(store: string, ...args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", fileURLToPath(new URL("../mod.ts", import.meta.url)), ...args],
    env: { NO_COLOR: "1", SLUICE_MODELS: store },
    stdin: "null",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** A store holding the demo model as `demo` and as `org/demo`. */
async function demoStore(): Promise<string> {
  const store = join(tempDir(), "models");
  const demo = await demoModelPath(true);
  cpSync(demo, join(store, "demo.sluice"), { recursive: true });
  cpSync(demo, join(store, "org", "demo.sluice"), { recursive: true });
  return store;
}

Deno.test("list shows the store's models with size, architecture, format and floor; -m NAME runs one", async () => {
  const store = await demoStore();
  const list = await sluice(store, "list");
  assert.equal(list.code, 0, list.stderr);
  assert.match(list.stdout, /^NAME +SIZE +ARCHITECTURE +FORMAT +FLOOR/);
  assert.match(list.stdout, /^demo +2\d\.\d MiB +mixtral +f32\+bf16 \/ bf16 +\d+\.?\d* MiB$/m);
  assert.match(list.stdout, /^org\/demo +/m);
  const [entry] = JSON.parse((await sluice(store, "list", "--json")).stdout);
  const plan = JSON.parse((await sluice(store, "plan", "-m", "demo", "--json")).stdout);
  assert.equal(entry.floor, plan.floor);
  const args = ["generate", "--json", "-p", "Once", "-n", "4"];
  const byName = await sluice(store, ...args, "-m", "org/demo");
  assert.equal(byName.code, 0, byName.stderr);
  const byPath = await sluice(store, ...args, "-m", join(store, "demo.sluice"));
  assert.deepEqual(
    JSON.parse(byName.stdout).generated_ids,
    JSON.parse(byPath.stdout).generated_ids,
  );
  const typo = await sluice(store, ...args, "-m", "dmeo");
  assert.equal(typo.code, 1);
  assert.match(
    typo.stderr,
    /dmeo: no such file or folder, and no model of that name in .*models \(did you mean demo\?\)/,
  );
  const empty = await sluice(join(tempDir(), "none"), "list");
  assert.match(empty.stdout, /no models in .* yet: 'sluice pull org\/name' puts one there/);
});

Deno.test("-m org/repo not in the store: refused without a terminal, asked on one", async () => {
  const store = join(tempDir(), "models");
  const r = await sluice(store, "generate", "-m", "someorg/some-model", "-p", "x");
  assert.equal(r.code, 1);
  assert.match(
    r.stderr,
    /someorg\/some-model is not in the model store \(.*\): run `sluice pull someorg\/some-model` first/,
  );
  // The store is passed, not set in $SLUICE_MODELS: test files share one process.
  const demo = await demoModelPath(true);
  const asked: string[] = [];
  const pulled: string[] = [];
  const pull = (spec: string, out: string) => {
    pulled.push(spec);
    cpSync(demo, out, { recursive: true });
    return Promise.resolve();
  };
  await assert.rejects(
    resolveModel("someorg/some-model", {
      interactive: true,
      ask: (q) => !asked.push(q),
      pull,
      store,
    }),
    /someorg\/some-model: not pulled/,
  );
  assert.deepEqual(pulled, []);
  const got = await resolveModel("someorg/some-model@main", {
    interactive: true,
    ask: (q) => asked.push(q) > 0,
    pull,
    store,
  });
  assert.equal(got, join(store, "someorg", "some-model.sluice"));
  assert.deepEqual(pulled, ["someorg/some-model@main"]);
  assert.match(asked[0], /Pull it from the Hugging Face Hub and pack it\?/);
  // Now it is there: found by name, nothing asked.
  assert.equal(await resolveModel("someorg/some-model", { interactive: true, store }), got);
  assert.throws(() => storePath("../evil", store), /not a model name/);
});

Deno.test("a checkpoint folder or a GGUF file given to -m says what to run instead", async () => {
  const dir = join(tempDir(), "ckpt");
  await synthCheckpoint({
    arch: "mixtral",
    out: dir,
    size: 2 * 2 ** 20,
    seed: 1,
    progress: "off",
    log: () => {},
  });
  const store = join(tempDir(), "models");
  for (const cmd of [["generate", "-m", dir], ["plan", "-m", dir], ["inspect", dir]]) {
    const r = await sluice(store, ...cmd);
    assert.equal(r.code, 1, cmd.join(" "));
    assert.match(r.stderr, /ckpt: this is a checkpoint: run `sluice pack .*ckpt`/, cmd.join(" "));
  }
  const gguf = join(tempDir(), "model.bin");
  writeFileSync(gguf, new Uint8Array([0x47, 0x47, 0x55, 0x46, 3, 0, 0, 0]));
  const g = await sluice(store, "generate", "-m", gguf);
  assert.equal(g.code, 1);
  assert.match(g.stderr, /model\.bin: a GGUF file, which sluice does not read yet/);
});
