import { defineConfig } from 'vite';

// Relative asset paths: the same dist/ is served by the runtime's bridge and loaded by Tauri.
export default defineConfig({
  base: './',
  build: { outDir: 'dist', emptyOutDir: true, target: 'es2022', sourcemap: false },
});
