// One member of a JGroups throughput run: joins the group, waits until every member is in the
// view, sends messages (1 KiB by default) as fast as the stack takes them for the given time
// (if a sender), then one end marker, and counts the messages delivered until every sender's
// marker has come.
// Prints one JSON line: the member's rate over the whole run and over its second half. With
// --rate, senders pace their messages instead (taking turns, as Conclave's `bench latency`
// does), each stamped with the monotonic clock, which every process of the machine shares, and
// every member notes each delivery's delay.
//
// The stack is JGroups' tcp.xml with SEQUENCER for total order (jgroups-sequencer.xml), so that
// it is compared with Conclave's agreed delivery: every member delivers every message in one
// order, its own included.

import org.jgroups.BytesMessage;
import org.jgroups.JChannel;
import org.jgroups.Message;
import org.jgroups.Receiver;
import org.jgroups.View;

import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.locks.LockSupport;

public final class Throughput implements Receiver {
    private static final int SAMPLE_EVERY = 4096;
    private static final byte DATA = 1;
    private static final byte END = 2;

    private final int members;
    private final int senders;
    private final CountDownLatch full = new CountDownLatch(1);
    private final CountDownLatch ended = new CountDownLatch(1);
    private long delivered;
    private int ends;
    private long firstNs;
    private long lastNs;
    // (delivered, time) every SAMPLE_EVERY deliveries, for the second half's rate.
    private final List<long[]> samples = new ArrayList<>();
    // Delays of stamped messages (--rate), in nanoseconds.
    private long[] delays = new long[1024];
    private int delayCount;
    private boolean stamped;

    private Throughput(int members, int senders) {
        this.members = members;
        this.senders = senders;
    }

    @Override
    public void viewAccepted(View view) {
        if (view.size() >= members) {
            full.countDown();
        }
    }

    // JGroups delivers one sender's messages on one thread at a time, but different senders'
    // possibly on several: the counters are guarded.
    @Override
    public synchronized void receive(Message msg) {
        byte[] a = msg.getArray();
        byte kind = a[msg.getOffset()];
        long now = System.nanoTime();
        if (kind == DATA) {
            if (delivered == 0) {
                firstNs = now;
            }
            delivered++;
            lastNs = now;
            if (delivered % SAMPLE_EVERY == 0) {
                samples.add(new long[] {delivered, now});
            }
            if (stamped) {
                if (delayCount == delays.length) {
                    delays = Arrays.copyOf(delays, delays.length * 2);
                }
                delays[delayCount++] = now - ByteBuffer.wrap(a, msg.getOffset() + 1, 8).getLong();
            }
        } else if (kind == END) {
            ends++;
            if (ends == senders) {
                ended.countDown();
            }
        }
    }

    private synchronized String report(String name, boolean sending, long sent, int size) {
        double whole = (lastNs - firstNs) / 1e9;
        long midNs = firstNs + (lastNs - firstNs) / 2;
        long[] atMid = {0, firstNs};
        for (long[] s : samples) {
            if (s[1] <= midNs) {
                atMid = s;
            }
        }
        double half = (lastNs - atMid[1]) / 1e9;
        return String.format(
                "{\"peer\":\"jgroups\",\"member\":\"%s\",\"sender\":%b,\"sent\":%d,\"size\":%d,"
                        + "\"senders\":%d,\"delivered\":%d,\"seconds\":%.3f,\"msgs_per_s\":%.0f,"
                        + "\"second_half_msgs_per_s\":%.0f,\"rss_peak_mib\":%.1f,\"delays_us\":%s}",
                name, sending, sent, size, senders, delivered, whole,
                whole > 0 ? delivered / whole : 0.0,
                half > 0 ? (delivered - atMid[0]) / half : 0.0, rssPeakMib(), delaysJson());
    }

    private String delaysJson() {
        StringBuilder b = new StringBuilder("[");
        for (int i = 0; i < delayCount; i++) {
            if (i > 0) {
                b.append(',');
            }
            b.append(delays[i] / 1000);
        }
        return b.append(']').toString();
    }

    private static double rssPeakMib() {
        try {
            for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
                if (line.startsWith("VmHWM:")) {
                    return Long.parseLong(line.replaceAll("[^0-9]", "")) / 1024.0;
                }
            }
        } catch (Exception e) {
            // Not on Linux: no figure.
        }
        return 0;
    }

    public static void main(String[] args) throws Exception {
        String config = "jgroups-sequencer.xml";
        String name = "m";
        int members = 3;
        int senders = 3;
        boolean sending = false;
        int size = 1024;
        double seconds = 15;
        double rate = 0;
        double phase = 0;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--config" -> config = args[++i];
                case "--name" -> name = args[++i];
                case "--members" -> members = Integer.parseInt(args[++i]);
                case "--senders" -> senders = Integer.parseInt(args[++i]);
                case "--send" -> sending = true;
                case "--size" -> size = Integer.parseInt(args[++i]);
                case "--seconds" -> seconds = Double.parseDouble(args[++i]);
                case "--rate" -> rate = Double.parseDouble(args[++i]);
                case "--phase" -> phase = Double.parseDouble(args[++i]);
                default -> throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        if (size < 9) {
            throw new IllegalArgumentException("--size must be at least 9 bytes");
        }
        Throughput t = new Throughput(members, senders);
        t.stamped = rate > 0;
        try (JChannel ch = new JChannel(config)) {
            ch.setName(name);
            ch.setReceiver(t);
            ch.connect("conclave-compare");
            t.full.await();
            // Every member has seen the full view; let the last joiner's view settle everywhere.
            Thread.sleep(1000);
            long sent = 0;
            if (sending) {
                long start = System.nanoTime();
                long deadline = start + (long) (seconds * 1e9);
                // This sender's share of the rate, starting `phase` of an interval late.
                long interval = rate > 0 ? (long) (1e9 * senders / rate) : 0;
                long next = start + (long) (phase * interval);
                while (System.nanoTime() < deadline) {
                    if (interval > 0) {
                        if (next >= deadline) {
                            break;
                        }
                        long wait;
                        while ((wait = next - System.nanoTime()) > 0) {
                            LockSupport.parkNanos(wait);
                        }
                        next += interval;
                    }
                    // A fresh payload per message, as an application would send.
                    byte[] payload = new byte[size];
                    payload[0] = DATA;
                    ByteBuffer.wrap(payload, 1, 8).putLong(interval > 0 ? System.nanoTime() : sent);
                    ch.send(new BytesMessage(null, payload));
                    sent++;
                }
                ch.send(new BytesMessage(null, new byte[] {END}));
            }
            t.ended.await();
            System.out.println(t.report(name, sending, sent, size));
            System.out.flush();
            // Stay until the others have counted too: a member leaving early changes the view.
            Thread.sleep(2000);
        }
    }
}
