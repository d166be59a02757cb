// The memoplan extension for VS Code: the TextMate grammar (memplan.tmLanguage.json, declared in
// package.json) colours .memplan files, and this starts `memoplan lsp` for diagnostics, hover,
// completion and formatting.  `npm run bundle` bundles it with vscode-languageclient into
// dist/extension.js, the file VS Code loads (docs/editors.md).
"use strict";

const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

// The server's command: `memoplan.command` when the user set it; else the interpreter selected in
// the Python extension (`python -m memoplan lsp`), when that extension is installed; else
// `memoplan lsp` from PATH.
async function serverCommand(config) {
  const inspected = config.inspect("command") || {};
  const chosen = inspected.workspaceFolderValue || inspected.workspaceValue || inspected.globalValue;
  if (Array.isArray(chosen) && chosen.length > 0) {
    const [command, ...args] = chosen;
    return { command, args, from: "the memoplan.command setting" };
  }
  const python = await selectedInterpreter();
  if (python) {
    return { command: python, args: ["-m", "memoplan", "lsp"], from: "the Python extension's selected interpreter" };
  }
  return { command: "memoplan", args: ["lsp"], from: "PATH" };
}

async function selectedInterpreter() {
  const extension = vscode.extensions.getExtension("ms-python.python");
  if (!extension) {
    return undefined;
  }
  try {
    const api = extension.isActive ? extension.exports : await extension.activate();
    const folder = vscode.workspace.workspaceFolders && vscode.workspace.workspaceFolders[0];
    const resource = folder ? folder.uri : undefined;
    if (api && api.environments) {
      const active = api.environments.getActiveEnvironmentPath(resource);
      const resolved = active ? await api.environments.resolveEnvironment(active) : undefined;
      const path = resolved && resolved.executable && resolved.executable.uri ? resolved.executable.uri.fsPath : active && active.path;
      if (path) {
        return path;
      }
    }
    if (api && api.settings && api.settings.getExecutionDetails) {
      const details = api.settings.getExecutionDetails(resource);
      if (details && details.execCommand && details.execCommand.length > 0) {
        return details.execCommand[0];
      }
    }
  } catch (error) {
    return undefined; // an older or broken Python extension: fall back to PATH
  }
  return undefined;
}

async function start(context) {
  const config = vscode.workspace.getConfiguration("memoplan");
  const { command, args, from } = await serverCommand(config);
  const clientOptions = {
    documentSelector: [{ language: "memplan" }],
    initializationOptions: {
      loadModel: config.get("loadModel", false),
      modelTimeout: config.get("modelTimeout", 120),
    },
  };
  client = new LanguageClient("memoplan", "memoplan", { command, args }, clientOptions);
  client.outputChannel.appendLine(`memoplan: starting ${[command, ...args].join(" ")} (from ${from})`);
  await client.start();
  return client;
}

async function activate(context) {
  await start(context);
  context.subscriptions.push({ dispose: () => (client ? client.stop() : undefined) });
  // A different interpreter selected in the Python extension: restart the server with it.
  const python = vscode.extensions.getExtension("ms-python.python");
  const api = python && python.isActive ? python.exports : undefined;
  if (api && api.environments && api.environments.onDidChangeActiveEnvironmentPath) {
    context.subscriptions.push(
      api.environments.onDidChangeActiveEnvironmentPath(async () => {
        if (client) {
          await client.stop();
        }
        await start(context);
      })
    );
  }
  return { client: () => client };
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
