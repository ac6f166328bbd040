// End-to-end: joining a group whose relay no contact vouched for (a self-signed relay someone
// hosts on their machine). The join dialog says which relay and shows its certificate's SHA-256;
// only "Trust this relay and join" trusts it, and the join then goes through. Driven by
// tests/tests/ui_relay_trust_e2e.rs, which plays bob (his profile on that relay).
//
// Environment: UI_URL (the single-use sign-in link), RELAY_URL, RELAY_CERT (hex), SHOT_DIR, CHROMIUM.

import { assert, driver, env, nav, scenario, shot, step } from './harness.mjs';

const UI_URL = env('UI_URL');
const RELAY_URL = env('RELAY_URL');
const RELAY_CERT = env('RELAY_CERT');

async function pasteAnywhere(page, text) {
  await page.evaluate((t) => {
    const dt = new DataTransfer();
    dt.setData('text/plain', t);
    document.body.dispatchEvent(new ClipboardEvent('paste', { clipboardData: dt, bubbles: true, cancelable: true }));
  }, text);
}

await scenario(async ({ page }) => {
  step("bob's invite lives on his self-signed relay: joining asks to trust it first");
  await page.goto(UI_URL);
  const link = await driver({ op: 'bob_invite', name: 'Garage band' });
  await nav(page, 'Chats').click();
  await pasteAnywhere(page, link);
  const dialog = page.getByRole('dialog', { name: 'Join group?' });
  await dialog.waitFor();
  await dialog.getByRole('button', { name: 'Join group' }).click();
  const trust = dialog.getByRole('group', { name: 'Trust this relay?' });
  await trust.waitFor({ timeout: 15_000 });
  const words = await trust.textContent();
  assert(words.includes(RELAY_URL), `the relay's URL is shown: ${words}`);
  const shown = (await trust.getByLabel('Certificate SHA-256').textContent()).replace(/\s/g, '');
  assert(shown === RELAY_CERT, `the certificate shown (${shown}) is the relay's (${RELAY_CERT})`);
  assert((await dialog.getByRole('alert').count()) === 0 || !(await dialog.getByRole('alert').isVisible()), 'no error, a question');
  await shot(page, 'trust-relay');

  step('trusting it joins the group');
  await dialog.getByRole('button', { name: 'Trust this relay and join' }).click();
  await page.getByRole('heading', { name: 'Group: Garage band' }).waitFor({ timeout: 30_000 });
  await driver({ op: 'bob_say', text: 'Through my own relay' });
  await page.getByRole('log', { name: 'Messages in Garage band' }).getByText('Through my own relay').waitFor({ timeout: 15_000 });
  await shot(page, 'joined-through-trusted-relay');

  step('the runtime records that the person accepted it');
  const trusted = await page.evaluate(async () => {
    const r = await fetch('/v1/rpc', { method: 'POST', body: '{"op":"relay_trusted"}', headers: { 'content-type': 'application/json' } });
    return r.json();
  });
  assert(
    trusted.length === 1 && trusted[0].url === RELAY_URL && trusted[0].cert_sha256 === RELAY_CERT && trusted[0].source === 'you',
    `trusted relays: ${JSON.stringify(trusted)}`,
  );
});
