// Tokenizes .memplan files with the TextMate grammar as VS Code does (vscode-textmate with the
// Oniguruma regex engine) and prints every line's tokens as JSON:
//   {"FILE": [[[startIndex, endIndex, [scopes...]], ...], ...], ...}   (indices in UTF-16 units)
// tests/test_textmate.py compares them with memoplan's Python tokenizer when
// `npm install` has been run in this folder (the devDependencies); otherwise that test is skipped.
//   usage: node tokenize.js GRAMMAR.json FILE...
"use strict";

const fs = require("fs");
const path = require("path");
const vsctm = require("vscode-textmate");
const oniguruma = require("vscode-oniguruma");

const wasm = fs.readFileSync(path.join(path.dirname(require.resolve("vscode-oniguruma")), "onig.wasm")).buffer;
const onigLib = oniguruma.loadWASM(wasm).then(() => ({
  createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
  createOnigString: (text) => new oniguruma.OnigString(text),
}));

const [grammarPath, ...files] = process.argv.slice(2);
const registry = new vsctm.Registry({
  onigLib,
  loadGrammar: async () => vsctm.parseRawGrammar(fs.readFileSync(grammarPath, "utf8"), grammarPath),
});

registry.loadGrammar("source.memplan").then((grammar) => {
  const out = {};
  for (const file of files) {
    const text = fs.readFileSync(file, "utf8").replace(/^\uFEFF/, "").replace(/\r\n?/g, "\n");
    let state = vsctm.INITIAL;
    out[file] = text.split("\n").map((line) => {
      const result = grammar.tokenizeLine(line, state);
      state = result.ruleStack;
      return result.tokens.map((token) => [token.startIndex, token.endIndex, token.scopes]);
    });
  }
  process.stdout.write(JSON.stringify(out));
});
