// End-to-end: the owner approves an ASNET challenge in the browser. Driven by
// tests/tests/asnet_client.rs over real Postfix and Dovecot: alice's agent asked to connect to bob;
// the service's challenge reaches alice's mailbox, her runtime (the `switchboard ui` process)
// reads it (woken by IMAP IDLE), and the review queue shows the exact action, naming the agent. Approving sends VERIFY.
//
// Environment: UI_URL (the single-use sign-in link), BOB_MEMBER, SHOT_DIR, CHROMIUM.

import { assert, env, nav, scenario, shot, step } from './harness.mjs';

const UI_URL = env('UI_URL');
const BOB = env('BOB_MEMBER');

await scenario(async ({ page }) => {
  step('the challenge for the agent’s request waits in the review queue, in words');
  await page.goto(UI_URL);
  const item = page.locator('li.review-item').filter({ hasText: `Connect to ${BOB} with contact:email, profile:basic` });
  // Nothing here reads the mailbox: the runtime's IMAP IDLE does, when the challenge lands.
  for (let i = 0; ; i++) {
    await nav(page, 'Agents').click();
    await page.getByRole('heading', { name: 'Local agents' }).waitFor();
    await nav(page, 'Review').click();
    await page.getByRole('heading', { name: 'Review queue' }).waitFor();
    if ((await item.count()) > 0) break;
    assert(i < 60, 'the challenge never reached the review queue (is IMAP IDLE waking the runtime?)');
    await page.waitForTimeout(500);
  }
  assert((await item.textContent()).includes('scout'), 'the item names the agent that asked');
  assert((await item.textContent()).includes('ASNET challenge'), 'the item says what it is');
  await shot(page, 'asnet-challenge');

  step('approving it sends the confirmation');
  await item.getByRole('button', { name: /^Approve and send/ }).click();
  await page.getByRole('status').filter({ hasText: 'Approved: the confirmation is on its way' }).waitFor();
  await page.getByText('Nothing is waiting for review.').waitFor();
});
