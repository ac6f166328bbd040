// End-to-end: the owner approves an ASNET challenge in the browser. Driven by
// tests/tests/asnet_client.rs over real Postfix and Dovecot: alice's agent asked to connect to bob;
// the service's challenge reaches alice's mailbox, her runtime (the `switchboard ui` process)
// reads it, and the review queue shows the exact action, naming the agent. Approving sends VERIFY.
//
// Environment: UI_URL (the single-use sign-in link), BOB_MEMBER, SHOT_DIR, CHROMIUM.

import { assert, env, nav, scenario, shot, step } from './harness.mjs';

const UI_URL = env('UI_URL');
const BOB = env('BOB_MEMBER');

await scenario(async ({ page }) => {
  step('the challenge for the agent’s request waits in the review queue, in words');
  await page.goto(UI_URL);
  const item = page.locator('li.review-item').filter({ hasText: `Connect to ${BOB} with contact:email, profile:basic` });
  // The agent network screen reads the mailbox; the review queue then holds the challenge.
  for (let i = 0; ; i++) {
    await page.evaluate(() => (location.hash = '#/network'));
    await page.getByRole('heading', { name: 'Agent network' }).waitFor();
    await nav(page, 'Review').click();
    await page.getByRole('heading', { name: 'Review queue' }).waitFor();
    if ((await item.count()) > 0) break;
    assert(i < 60, 'the challenge never reached the review queue');
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
