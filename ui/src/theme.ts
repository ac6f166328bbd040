// Light or dark: the system's preference (prefers-color-scheme) unless the person chose one in
// Settings; the choice is kept on this device. The palettes are CSS custom properties in
// style.css, switched by `data-theme` on the root element.

export type Theme = 'system' | 'light' | 'dark';
const KEY = 'switchboard.theme';

export function theme(): Theme {
  try {
    const t = localStorage.getItem(KEY);
    return t === 'light' || t === 'dark' ? t : 'system';
  } catch {
    return 'system';
  }
}

export function applyTheme(t: Theme = theme()) {
  if (t === 'system') delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = t;
}

export function setTheme(t: Theme) {
  try {
    if (t === 'system') localStorage.removeItem(KEY);
    else localStorage.setItem(KEY, t);
  } catch {
    /* not kept: applies to this window only */
  }
  applyTheme(t);
}

applyTheme();
