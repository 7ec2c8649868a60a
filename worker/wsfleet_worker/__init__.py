"""wsfleet Fargate worker: SQS hints, lease acquisition, heartbeats and WebSocket sessions."""
