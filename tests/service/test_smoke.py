from tests.builders import fetch_state, make_state


async def test_pending_context_completes_both_stages(engine, worker, fake_openai):
    await make_state(engine, context_id=1)
    await worker.process(1, "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음.")
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert fake_openai.embedding_calls == 1
    assert fake_openai.judge_calls == 1
