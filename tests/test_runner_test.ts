/**
 * `deno task test`'s last line (tools/dev/test.ts): skipped tests counted by the reasons the
 * modules recorded, the rest named as other reasons, and the counts and slowest files read from
 * a JUnit report.
 */
import assert from "node:assert/strict";
import { junitCounts, skipSummary, slowestFiles } from "../tools/dev/test.ts";

Deno.test("skip summary: reasons by count, unrecorded skips as other reasons, none at all", () => {
  const reasons = [
    ...Array(3).fill("need ../shared/models"),
    "need tmux",
    ...Array(2).fill("are llama.cpp comparisons (deno task test:llamacpp)"),
  ];
  assert.equal(
    skipSummary(40, 7, reasons),
    "skipped 7 of 40 tests: 3 need ../shared/models, 2 are llama.cpp comparisons " +
      '(deno task test:llamacpp), 1 need tmux, 1 for other reasons (marked "ignored" above)',
  );
  assert.equal(skipSummary(40, 0, []), "no test of 40 skipped");
});

Deno.test("JUnit report: tests and skipped counted", () => {
  const xml = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="deno test" tests="3" failures="0" errors="0" time="0.006">
    <testsuite name="./tests/a_test.ts" tests="3" disabled="2" errors="0" failures="0">
        <testcase name="a" classname="./tests/a_test.ts" time="0.000"><skipped/></testcase>
        <testcase name="b" classname="./tests/a_test.ts" time="0.000">
            <skipped />
        </testcase>
        <testcase name="c" classname="./tests/a_test.ts" time="0.001"></testcase>
    </testsuite>
</testsuites>`;
  assert.deepEqual(junitCounts(xml), { total: 3, skipped: 2 });
});

Deno.test("JUnit report: the slowest files by their tests' summed times", () => {
  const xml = `<testsuites name="deno test" tests="4">
    <testsuite name="./tests/a_test.ts" tests="2">
        <testcase name="a1" classname="./tests/a_test.ts" time="1.500"></testcase>
        <testcase name="a2" classname="./tests/a_test.ts" time="2.000"><skipped/></testcase>
    </testsuite>
    <testsuite name="./tests/b_test.ts" tests="1">
        <testcase name="b" classname="./tests/b_test.ts" time="4.250"></testcase>
    </testsuite>
    <testsuite name="./tests/c_test.ts" tests="1">
        <testcase name="c" classname="./tests/c_test.ts" time="0.100"></testcase>
    </testsuite>
</testsuites>`;
  assert.deepEqual(slowestFiles(xml, 2), [
    { file: "tests/b_test.ts", seconds: 4.25 },
    { file: "tests/a_test.ts", seconds: 3.5 },
  ]);
  assert.deepEqual(slowestFiles("<testsuites/>", 5), []);
});
