// The memoplan extension for VS Code: the TextMate grammar (memplan.tmLanguage.json, declared in
// package.json) colours .memplan files, and this starts `memoplan lsp` for diagnostics, hover,
// completion and formatting.  Install: `npm install` in this folder, then run VS Code with
// `--extensionDevelopmentPath=<this folder>` (or package it with `npx @vscode/vsce package`).
"use strict";

const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const config = vscode.workspace.getConfiguration("memoplan");
  const [command, ...args] = config.get("command", ["memoplan", "lsp"]);
  const serverOptions = { command, args };
  const clientOptions = {
    documentSelector: [{ language: "memplan" }],
    initializationOptions: {
      loadModel: config.get("loadModel", false),
      modelTimeout: config.get("modelTimeout", 120),
    },
  };
  client = new LanguageClient("memoplan", "memoplan", serverOptions, clientOptions);
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
