// Headless activation test of the bundled extension (dist/extension.js) with a stand-in for the
// `vscode` module (VS Code itself is not needed): activate it, open a .memplan document, and wait
// until the real `memoplan lsp` it starts publishes diagnostics into VS Code's diagnostic
// collection.  Prints one JSON line with what was seen; exits 0 when diagnostics came.
//   node test/activate.js PLAN.memplan [--python PATH] [--extension DIR]   (tests/test_vscode.py)
// --extension: the extension's folder (default: this file's parent), e.g. the files a VSIX holds.
// Not shipped: .vscodeignore leaves test/ out of the package.
"use strict";

const Module = require("module");
const path = require("path");
const fs = require("fs");
const { URL, pathToFileURL, fileURLToPath } = require("url");

const planPath = path.resolve(process.argv[2]);
const pythonAt = process.argv.indexOf("--python");
const python = pythonAt > 0 ? process.argv[pythonAt + 1] : undefined;
const extensionAt = process.argv.indexOf("--extension");
const extensionDir = extensionAt > 0 ? path.resolve(process.argv[extensionAt + 1]) : path.join(__dirname, "..");
const seen = { diagnostics: [], log: [], commandFrom: null };

// ------------------------------------------------------------------ a small `vscode`

class Disposable {
  constructor(fn) { this.fn = fn; }
  static from(...items) { return new Disposable(() => items.forEach((d) => d && d.dispose && d.dispose())); }
  dispose() { if (this.fn) { this.fn(); this.fn = undefined; } }
}
class EventEmitter {
  constructor() { this.listeners = []; this.event = (listener) => { this.listeners.push(listener); return new Disposable(() => {}); }; }
  fire(value) { this.listeners.forEach((l) => l(value)); }
  dispose() { this.listeners = []; }
}
const noEvent = () => new Disposable(() => {});
class Position { constructor(line, character) { this.line = line; this.character = character; } }
class Range {
  constructor(a, b, c, d) {
    if (typeof a === "number") { this.start = new Position(a, b); this.end = new Position(c, d); }
    else { this.start = a; this.end = b; }
  }
}
class Uri {
  constructor(scheme, fsPath, str) { this.scheme = scheme; this.fsPath = fsPath; this.path = fsPath; this._str = str; }
  static parse(value) { const url = new URL(value); return new Uri(url.protocol.replace(":", ""), url.protocol === "file:" ? fileURLToPath(url) : url.pathname, value); }
  static file(p) { return new Uri("file", p, pathToFileURL(p).href); }
  toString() { return this._str; }
  with() { return this; }
  toJSON() { return this._str; }
}
class Diagnostic { constructor(range, message, severity) { this.range = range; this.message = message; this.severity = severity; } }
class MarkdownString { constructor(value) { this.value = value || ""; } appendMarkdown(v) { this.value += v; return this; } }
class CancellationTokenSource {
  constructor() { this.token = { isCancellationRequested: false, onCancellationRequested: noEvent }; }
  cancel() { this.token.isCancellationRequested = true; }
  dispose() {}
}
class Generic { constructor(...args) { this.args = args; } }

const text = fs.readFileSync(planPath, "utf8");
const lines = text.split("\n");
const document = {
  uri: Uri.file(planPath),
  fileName: planPath,
  languageId: "memplan",
  version: 1,
  isClosed: false,
  isDirty: false,
  isUntitled: false,
  lineCount: lines.length,
  eol: 1,
  getText: () => text,
  lineAt: (line) => ({ text: lines[typeof line === "number" ? line : line.line] }),
  offsetAt: () => 0,
  positionAt: () => new Position(0, 0),
  save: async () => true,
};

const collections = [];
function diagnosticCollection(name) {
  const entries = new Map();
  const collection = {
    name,
    set(uri, diagnostics) {
      if (Array.isArray(uri)) { uri.forEach(([u, d]) => collection.set(u, d)); return; }
      entries.set(uri.toString(), diagnostics || []);
      if (diagnostics && diagnostics.length) finish(uri, diagnostics);
    },
    get: (uri) => entries.get(uri.toString()),
    has: (uri) => entries.has(uri.toString()),
    delete: (uri) => entries.delete(uri.toString()),
    clear: () => entries.clear(),
    forEach: (fn) => entries.forEach((d, u) => fn(Uri.parse(u), d, collection)),
    dispose: () => entries.clear(),
  };
  collections.push(collection);
  return collection;
}

const settings = { command: undefined, loadModel: false, modelTimeout: 120 };
function configuration(section) {
  const values = section === "memoplan" ? settings : {};
  return {
    get: (key, fallback) => (values[key] !== undefined ? values[key] : fallback),
    has: (key) => values[key] !== undefined,
    inspect: (key) => ({ key, defaultValue: undefined, globalValue: values[key] }),
    update: async () => {},
  };
}

// The Python extension's API, as far as the extension uses it, pointing at `python`.
const pythonExtension = python
  ? {
      id: "ms-python.python",
      isActive: true,
      exports: {
        environments: {
          getActiveEnvironmentPath: () => ({ id: python, path: python }),
          resolveEnvironment: async () => ({ executable: { uri: Uri.file(python) } }),
          onDidChangeActiveEnvironmentPath: noEvent,
        },
      },
      activate: async () => pythonExtension.exports,
    }
  : undefined;

const output = { name: "memoplan", append: (s) => seen.log.push(s), appendLine: (s) => seen.log.push(s), clear() {}, show() {}, hide() {}, dispose() {}, replace() {} };

const registered = () => new Disposable(() => {});
const vscode = {
  version: "1.95.0",
  Disposable, EventEmitter, Position, Range, Uri, Diagnostic, MarkdownString, CancellationTokenSource,
  Location: Generic, Hover: Generic, CompletionItem: Generic, CompletionList: Generic, TextEdit: Generic,
  SnippetString: Generic, DiagnosticRelatedInformation: Generic, CodeAction: Generic, WorkspaceEdit: Generic,
  SemanticTokensLegend: Generic, CallHierarchyItem: Generic, TypeHierarchyItem: Generic, SymbolInformation: Generic,
  DocumentSymbol: Generic, DocumentLink: Generic, Color: Generic, ColorInformation: Generic, ColorPresentation: Generic,
  FoldingRange: Generic, SelectionRange: Generic, InlayHint: Generic, InlineValueText: Generic, CodeLens: Generic,
  ThemeIcon: Generic, TabInputText: Generic, TabInputTextDiff: Generic, NotebookCellKind: { Markup: 1, Code: 2 },
  DiagnosticSeverity: { Error: 0, Warning: 1, Information: 2, Hint: 3 },
  DiagnosticTag: { Unnecessary: 1, Deprecated: 2 },
  CompletionItemKind: new Proxy({}, { get: (_, k) => k }),
  SymbolKind: new Proxy({}, { get: (_, k) => k }),
  CompletionTriggerKind: { Invoke: 0, TriggerCharacter: 1, TriggerForIncompleteCompletions: 2 },
  SignatureHelpTriggerKind: { Invoke: 1, TriggerCharacter: 2, ContentChange: 3 },
  TextDocumentSaveReason: { Manual: 1, AfterDelay: 2, FocusOut: 3 },
  CodeActionKind: { Empty: { value: "" }, QuickFix: { value: "quickfix" } },
  FileType: { Unknown: 0, File: 1, Directory: 2, SymbolicLink: 64 },
  ConfigurationTarget: { Global: 1, Workspace: 2, WorkspaceFolder: 3 },
  ViewColumn: { Active: -1 },
  StatusBarAlignment: { Left: 1, Right: 2 },
  LanguageStatusSeverity: { Information: 0, Warning: 1, Error: 2 },
  ProgressLocation: { Notification: 15, Window: 10 },
  UIKind: { Desktop: 1, Web: 2 },
  env: { appName: "stub", language: "en", machineId: "stub", sessionId: "stub", uiKind: 1, openExternal: async () => true },
  extensions: { getExtension: (id) => (id === "ms-python.python" ? pythonExtension : undefined), all: [] },
  commands: { registerCommand: registered, executeCommand: async () => undefined },
  window: {
    createOutputChannel: () => output,
    showErrorMessage: async (m) => { seen.log.push(`error: ${m}`); },
    showWarningMessage: async (m) => { seen.log.push(`warning: ${m}`); },
    showInformationMessage: async () => undefined,
    activeTextEditor: undefined,
    visibleTextEditors: [],
    onDidChangeActiveTextEditor: noEvent,
    onDidChangeVisibleTextEditors: noEvent,
    createStatusBarItem: () => ({ show() {}, hide() {}, dispose() {} }),
    withProgress: async (_, task) => task({ report() {} }, new CancellationTokenSource().token),
    tabGroups: { all: [], onDidChangeTabs: noEvent },
  },
  workspace: {
    workspaceFolders: [{ uri: Uri.file(path.dirname(planPath)), name: "plans", index: 0 }],
    textDocuments: [document],
    notebookDocuments: [],
    getConfiguration: configuration,
    getWorkspaceFolder: () => undefined,
    onDidChangeConfiguration: noEvent,
    onDidOpenTextDocument: noEvent,
    onDidCloseTextDocument: noEvent,
    onDidChangeTextDocument: noEvent,
    onDidSaveTextDocument: noEvent,
    onWillSaveTextDocument: noEvent,
    onDidChangeWorkspaceFolders: noEvent,
    onDidOpenNotebookDocument: noEvent,
    onDidCloseNotebookDocument: noEvent,
    onDidChangeNotebookDocument: noEvent,
    onDidSaveNotebookDocument: noEvent,
    onDidCreateFiles: noEvent, onDidRenameFiles: noEvent, onDidDeleteFiles: noEvent,
    onWillCreateFiles: noEvent, onWillRenameFiles: noEvent, onWillDeleteFiles: noEvent,
    createFileSystemWatcher: () => ({ onDidCreate: noEvent, onDidChange: noEvent, onDidDelete: noEvent, dispose() {} }),
    fs: { stat: async () => ({ type: 1 }) },
    registerTextDocumentContentProvider: registered,
    applyEdit: async () => true,
    openTextDocument: async () => document,
  },
  languages: {
    createDiagnosticCollection: diagnosticCollection,
    match: (selector, doc) => ([].concat(selector).some((s) => (typeof s === "string" ? s : s.language) === doc.languageId) ? 10 : 0),
    onDidChangeDiagnostics: noEvent,
    getDiagnostics: () => [],
    setLanguageConfiguration: registered,
  },
};
vscode.languages = new Proxy(vscode.languages, {
  get: (target, key) => (key in target ? target[key] : typeof key === "string" && key.startsWith("register") ? registered : undefined),
});

// Any other class the client extends or constructs (CancellationError, CodeLens, ...): a plain one.
const classes = {};
const stub = new Proxy(vscode, {
  get: (target, key) => {
    if (key in target) return target[key];
    if (typeof key === "string" && /^[A-Z]/.test(key)) {
      classes[key] = classes[key] || class extends Generic {};
      return classes[key];
    }
    return undefined;
  },
});

const load = Module._load;
Module._load = function (request, parent, isMain) {
  return request === "vscode" ? stub : load.call(this, request, parent, isMain);
};

// ------------------------------------------------------------------ the run

let extension;
let done = false;
function finish(uri, diagnostics) {
  if (done) return;
  done = true;
  seen.uri = uri.toString();
  seen.diagnostics = diagnostics.map((d) => ({
    code: typeof d.code === "object" && d.code !== null ? d.code.value : d.code,
    line: d.range.start.line,
    character: d.range.start.character,
    severity: d.severity,
    message: d.message,
  }));
  const stopping = extension.deactivate();
  Promise.resolve(stopping).catch(() => {}).then(() => {
    console.log(JSON.stringify(seen));
    process.exit(0);
  });
}

setTimeout(() => {
  seen.error = "no diagnostics within 120 s";
  console.log(JSON.stringify(seen));
  process.exit(1);
}, 120000).unref();

(async () => {
  const main = path.join(extensionDir, require(path.join(extensionDir, "package.json")).main);
  extension = require(main);
  const subscriptions = [];
  await extension.activate({ subscriptions, extensionPath: extensionDir, extensionUri: Uri.file(extensionDir) });
  seen.activated = true;
  seen.commandFrom = seen.log.find((line) => line.startsWith("memoplan: starting")) || null;
})().catch((error) => {
  seen.error = String(error && error.stack ? error.stack : error);
  console.log(JSON.stringify(seen));
  process.exit(1);
});
