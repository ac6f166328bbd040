// Imported first by main.ts: the built-in prototypes are frozen before any other module runs, so
// prototype pollution (a crafted key such as `__proto__` reaching an assignment) cannot change
// how the UI's objects behave. The desktop shell's `freezePrototype` does the same for
// Object.prototype in its webview; this covers the browser UI too.
for (const p of [Object.prototype, Array.prototype, Function.prototype]) Object.freeze(p);

export {};
