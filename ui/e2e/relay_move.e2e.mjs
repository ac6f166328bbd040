// End-to-end: moving to another relay from Settings. A relay that does not answer, and a
// self-signed one without its fingerprint, are refused in plain words and change nothing; with
// the certificate's SHA-256 the profile moves, Settings shows the new relay, and a person who
// lives only on the new relay reaches alice there: his request shows, she approves it, his message
// arrives. Driven by tests/tests/ui_relay_move_e2e.rs, which plays bob (his profile on the new
// relay).
//
// Environment: UI_URL (the single-use sign-in link), NEW_RELAY_URL, NEW_RELAY_CERT (hex),
// DOWN_RELAY_URL, SHOT_DIR, CHROMIUM.

import { assert, driver, env, nav, scenario, shot, step } from './harness.mjs';

const UI_URL = env('UI_URL');
const NEW_RELAY_URL = env('NEW_RELAY_URL');
const NEW_RELAY_CERT = env('NEW_RELAY_CERT');
const DOWN_RELAY_URL = env('DOWN_RELAY_URL');

async function rpc(page, body) {
  return page.evaluate(async (b) => {
    const r = await fetch('/v1/rpc', { method: 'POST', body: JSON.stringify(b), headers: { 'content-type': 'application/json' } });
    return r.json();
  }, body);
}

await scenario(async ({ page }) => {
  await page.goto(UI_URL);
  const before = await rpc(page, { op: 'whoami' });

  step('a relay that does not answer: refused in plain words, nothing changes');
  await nav(page, 'Settings').click();
  const form = page.locator('#relay-move');
  await form.getByRole('heading', { name: 'Move to another relay' }).waitFor();
  await form.getByLabel('New relay URL').fill(DOWN_RELAY_URL);
  await form.getByRole('button', { name: 'Move' }).click();
  const out = form.locator('#set-move-out.error');
  await out.waitFor({ timeout: 30_000 });
  const said = await out.textContent();
  assert(said.startsWith('Nothing changed: Switchboard could not reach that relay.'), `refusal: ${said}`);
  await shot(page, 'move-refused-down');

  step('a self-signed relay without its fingerprint: refused too');
  await form.getByLabel('New relay URL').fill(NEW_RELAY_URL);
  await form.getByRole('button', { name: 'Move' }).click();
  await page.waitForFunction(
    (old) => {
      const el = document.querySelector('#set-move-out.error');
      return el && el.textContent !== old;
    },
    said,
    { timeout: 30_000 },
  );
  const unchanged = await rpc(page, { op: 'whoami' });
  assert(JSON.stringify(unchanged) === JSON.stringify(before), 'a refused move changes nothing');

  step('with the certificate SHA-256 the profile moves');
  await form.getByLabel('Certificate SHA-256 (only for a self-signed relay)').fill(NEW_RELAY_CERT);
  await form.getByRole('button', { name: 'Move' }).click();
  await page.getByRole('status').filter({ hasText: `Moved to ${NEW_RELAY_URL}` }).waitFor({ timeout: 30_000 });
  await page.locator('table code', { hasText: NEW_RELAY_URL }).first().waitFor();
  await shot(page, 'moved');
  const after = await rpc(page, { op: 'whoami' });
  assert(after.letagents.relay === NEW_RELAY_URL, `whoami's relay: ${after.letagents.relay}`);
  assert(after.stringcup.id && after.stringcup.id !== before.stringcup.id, 'a Stringcup identity from the new relay');

  step('bob, who lives only on the new relay, reaches alice there');
  await driver({ op: 'bob_hello', to: after.letagents.address });
  await nav(page, 'Chats').click();
  const approve = page.getByRole('button', { name: 'Approve Bob' });
  await approve.waitFor({ timeout: 30_000 });
  await approve.click();
  await page.getByRole('link', { name: 'Open conversation with Bob' }).waitFor();
  await driver({ op: 'bob_say', text: 'Found you on the new relay' });
  await page.getByRole('link', { name: 'Open conversation with Bob' }).click();
  await page.locator('.msg.in', { hasText: 'Found you on the new relay' }).waitFor({ timeout: 30_000 });
  await shot(page, 'reached-on-new-relay');
});
