"""The PinLog core service: owns members, records and contexts; dispatches and rescans (§9)."""
