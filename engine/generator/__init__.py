"""The generator: job queue, scheduler and step loop, the job and its sequences, speculative decoding, result
streaming (text, stop strings, banned strings, filters), metrics and the asyncio front."""
