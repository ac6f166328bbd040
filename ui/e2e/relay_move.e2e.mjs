// End-to-end: moving to another relay from Settings. Carol (letagents) and dave (Stringcup), on
// alice's relay, are approved first. Every move is confirmed first ("1 contact will be told; 0
// groups stay on the old relay, and so does 1 Stringcup contact (…); the old relay is read for
// 48 h"); Cancel changes nothing. A relay that does not answer, and a self-signed one without its
// fingerprint, are refused in plain words and change nothing; with the certificate's SHA-256 the
// profile moves, Settings shows the new relay, carol is told (a signed notice carrying the new
// relay's pin) and her next message arrives through the new relay, and a person who lives only on
// the new relay reaches alice there: his request shows, she approves it, his message arrives.
// Dave cannot follow (a Stringcup id belongs to its relay): he and alice still reach each other
// through the identity the old relay assigned her. Driven by tests/tests/ui_relay_move_e2e.rs,
// which plays carol and dave (old relay) and bob (new relay).
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

  step('carol, on the same relay, asks; alice approves her');
  await driver({ op: 'carol_hello', to: before.letagents.address });
  await nav(page, 'Chats').click();
  const approveCarol = page.getByRole('button', { name: 'Approve Carol' });
  await approveCarol.waitFor({ timeout: 30_000 });
  await approveCarol.click();
  await page.getByRole('link', { name: 'Open conversation with Carol' }).waitFor();

  step('dave, a Stringcup contact on the same relay, writes; alice approves him');
  await driver({ op: 'dave_hello', to: before.stringcup.id, text: 'Dave here, over Stringcup' });
  const approveDave = page.getByRole('button', { name: 'Approve Dave' });
  await approveDave.waitFor({ timeout: 30_000 });
  await approveDave.click();
  await page.getByRole('link', { name: 'Open conversation with Dave' }).waitFor();
  const before2 = await rpc(page, { op: 'whoami' });

  step('the move is confirmed first: what happens, and Cancel changes nothing');
  await nav(page, 'Settings').click();
  const form = page.locator('#relay-move');
  await form.getByRole('heading', { name: 'Move to another relay' }).waitFor();
  const confirmBox = form.locator('#set-move-confirm');
  const expected =
    '1 contact will be told; 0 groups stay on the old relay, and so does 1 Stringcup contact (a Stringcup id belongs to the relay that assigned it); the old relay is read for 48 h.';
  async function submitAndConfirm(url) {
    await form.getByLabel('New relay URL').fill(url);
    await form.getByRole('button', { name: 'Move', exact: true }).click();
    await confirmBox.getByText(expected).waitFor({ timeout: 30_000 });
    await form.getByRole('button', { name: 'Move now' }).click();
  }
  await form.getByLabel('New relay URL').fill(DOWN_RELAY_URL);
  await form.getByRole('button', { name: 'Move', exact: true }).click();
  await confirmBox.getByText(expected).waitFor({ timeout: 30_000 });
  assert(await confirmBox.getByText(`Move to ${DOWN_RELAY_URL}?`).isVisible(), 'the confirmation names the relay');
  await shot(page, 'move-confirm');
  await form.getByRole('button', { name: 'Cancel' }).click();
  assert(await confirmBox.isHidden(), 'Cancel closes the confirmation');
  assert(JSON.stringify(await rpc(page, { op: 'whoami' })) === JSON.stringify(before2), 'Cancel changes nothing');

  step('a relay that does not answer: refused in plain words, nothing changes');
  await submitAndConfirm(DOWN_RELAY_URL);
  const out = form.locator('#set-move-out.error');
  await out.waitFor({ timeout: 30_000 });
  const said = await out.textContent();
  assert(said.startsWith('Nothing changed: Switchboard could not reach that relay.'), `refusal: ${said}`);
  await shot(page, 'move-refused-down');

  step('a self-signed relay without its fingerprint: refused too');
  await submitAndConfirm(NEW_RELAY_URL);
  await page.waitForFunction(
    (old) => {
      const el = document.querySelector('#set-move-out.error');
      return el && el.textContent !== old;
    },
    said,
    { timeout: 30_000 },
  );
  const unchanged = await rpc(page, { op: 'whoami' });
  assert(JSON.stringify(unchanged) === JSON.stringify(before2), 'a refused move changes nothing');

  step('with the certificate SHA-256 the profile moves');
  await form.getByLabel('Certificate SHA-256 (only for a self-signed relay)').fill(NEW_RELAY_CERT);
  await submitAndConfirm(NEW_RELAY_URL);
  await page.getByRole('status').filter({ hasText: `Moved to ${NEW_RELAY_URL}` }).waitFor({ timeout: 30_000 });
  await page.locator('table code', { hasText: NEW_RELAY_URL }).first().waitFor();
  await shot(page, 'moved');
  const after = await rpc(page, { op: 'whoami' });
  assert(after.letagents.relay === NEW_RELAY_URL, `whoami's relay: ${after.letagents.relay}`);
  assert(after.stringcup.id && after.stringcup.id !== before.stringcup.id, 'a Stringcup identity from the new relay');
  const kept = (after.stringcup.other_relays || []).find((k) => k.id === before.stringcup.id);
  assert(kept && kept.contacts === 1, `the old relay's identity is kept for dave: ${JSON.stringify(after.stringcup)}`);
  // Settings lists both relays: the new one as the profile's own, the old one with why it is
  // still read (drained for 48 h, and dave lives there).
  const oldUrl = before.letagents.relay.replace(/\/$/, '');
  const rows = page.locator('section[aria-labelledby="relays-title"] tbody tr');
  await rows.filter({ hasText: oldUrl }).waitFor({ timeout: 30_000 });
  const ownRow = rows.filter({ hasText: NEW_RELAY_URL });
  assert((await ownRow.textContent()).includes('Your relay'), `own row: ${await ownRow.textContent()}`);
  const oldRow = (await rows.filter({ hasText: oldUrl }).textContent()) ?? '';
  assert(
    oldRow.includes('Moved away: still read until') && oldRow.includes('1 Stringcup contact') && oldRow.includes('Checked every few seconds'),
    `old relay row: ${oldRow}`,
  );
  await rows.first().scrollIntoViewIfNeeded();
  await shot(page, 'relays-after-move');

  step('carol is told through the old relay, with the new relay and its pin');
  const seen = await driver({ op: 'carol_sees_move' });
  assert(seen.line.body === NEW_RELAY_URL, `carol's line: ${JSON.stringify(seen.line)}`);
  assert(seen.relay === NEW_RELAY_URL, `carol's route to alice: ${seen.relay}`);
  const pin = seen.trusted.find((t) => t.url === NEW_RELAY_URL);
  assert(pin && pin.cert_sha256 === NEW_RELAY_CERT.replace(/:/g, '').toLowerCase() && pin.source === 'contact', `carol's pin: ${JSON.stringify(seen.trusted)}`);
  await nav(page, 'Chats').click();
  await page.getByRole('link', { name: 'Open conversation with Carol' }).click();
  await page.locator('.msg.system', { hasText: `You told them you moved to ${NEW_RELAY_URL}` }).waitFor({ timeout: 30_000 });
  await driver({ op: 'carol_say', text: 'Got your move' });
  await page.locator('.msg.in', { hasText: 'Got your move' }).waitFor({ timeout: 30_000 });
  await shot(page, 'carol-after-move');

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

  step('dave stays on the old relay: he still reaches alice there, and she him');
  await driver({ op: 'dave_say', text: 'Still on the old relay' });
  await nav(page, 'Chats').click();
  await page.getByRole('link', { name: 'Open conversation with Dave' }).click();
  await page.locator('.msg.in', { hasText: 'Still on the old relay' }).waitFor({ timeout: 30_000 });
  await page.getByLabel('Message', { exact: true }).fill('I moved, but you reach me here');
  await page.getByRole('button', { name: 'Send' }).click();
  const toDave = await driver({ op: 'dave_wait_for', text: 'I moved, but you reach me here' });
  assert(toDave.from === 'alice', `dave got it from alice: ${JSON.stringify(toDave)}`);
  await shot(page, 'stringcup-on-old-relay');
});
