/**
 * The engine worker of the worker server (tools/serve/back.ts) with hooks for
 * tests/serve_worker_test.ts, given as the worker's data:
 * - `hold`: an Int32Array's SharedArrayBuffer. While word 0 is 1, the next forward pass stops at
 *   its first MoE layer (word 1 becomes 1) until word 0 is set back to 0, so a test knows the
 *   worker's thread is inside a forward pass, as in a long prefill, while it asks the front. A
 *   third word, if there is one, counts the MoE layers passes have run.
 * - `crash`: the worker dies of an uncaught error at its first yield after a forward pass starts.
 */
import { runBack } from "../tools/serve/back.ts";

runBack((session, data) => {
  const { hold, crash } = data as { hold?: SharedArrayBuffer; crash?: boolean };
  const observers = session.model.transformer.moeObservers;
  if (hold) {
    const words = new Int32Array(hold);
    observers.push(() => {
      if (words.length > 2) Atomics.add(words, 2, 1);
      if (Atomics.load(words, 0) !== 1) return;
      Atomics.store(words, 1, 1);
      while (Atomics.load(words, 0) === 1) Atomics.wait(words, 0, 1, 1000);
      Atomics.store(words, 1, 0);
    });
  }
  if (crash) {
    let armed = true;
    observers.push(() => {
      if (!armed) return;
      armed = false;
      setTimeout(() => {
        throw new Error("simulated engine crash");
      }, 0);
    });
  }
});
